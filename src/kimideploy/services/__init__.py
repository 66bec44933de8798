"""Use cases composed from config, plan, render (and later cluster, images, remote, provision)."""
