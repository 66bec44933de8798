"""The only importer of the `kubernetes` client: apply, prune, records, locks and watches."""
