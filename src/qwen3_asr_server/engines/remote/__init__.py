"""ENGINE=remote: the engine, one call (`call`), httpx clients (`clients`), the backends'
states and probes (`pool`)."""
