"""The HTTP API's route tables, one per group: ingress, admin, guard.

gateway/http.py's server mounts them beside its own (health, metrics,
OpenAPI) and maps every error once; a new group of routes is one more module
here with a `routes()` method.
"""
