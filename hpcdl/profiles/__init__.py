"""Cluster profiles: schema, lookup and loading."""

from hpcdl.profiles.loader import list_profiles, load_profile, load_profile_file
from hpcdl.profiles.schema import Partition, Profile

__all__ = ["Partition", "Profile", "list_profiles", "load_profile", "load_profile_file"]
