"""Plans to Kubernetes objects: Jinja templates, parse-back, strict validation, apply order."""
