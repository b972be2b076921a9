"""What every WebSocket route shares: auth, seats and outbox (`common`), typed client
messages (`messages`) and live speakers (`speakers`)."""
