"""The GPU hosts behind a cluster profile, over SSH: check, provision, sync the model."""
