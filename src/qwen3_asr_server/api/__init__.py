"""HTTP and WebSocket routers: parse, call a service, format."""
