"""Datasets on disk: the tiny ImageNet-format generator (``tiny``), a dataset packed
into one SquashFS file (``packed``) and where a job sees it (``mount``). The ImageFolder
layout checks a job runs itself are hpcdl.jobside.imagefolder.

Standard library only at import time (PIL is imported by the generator when it runs).
"""
