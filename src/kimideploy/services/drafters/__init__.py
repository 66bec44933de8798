"""The drafter registry: listing and `drafter check`."""
