"""Datasets on disk: ImageFolder layout checks and the tiny ImageNet-format generator.

Standard library only at import time (PIL is imported by the generator when it runs).
"""
