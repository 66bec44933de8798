"""Pinned images: the matrix, rendered Dockerfiles, build contexts, patches and their checks."""
