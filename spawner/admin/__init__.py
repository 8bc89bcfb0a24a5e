"""Admin tools behind the hub service's pages: the quota table editor's checks, preview,
safe saves and audit trail, and requests for a bigger role."""
