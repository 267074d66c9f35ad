"""Interactive queries (KIP-535): the HTTP server each instance runs, and the client router."""
