"""The arbiter service: store, REST and events, auth, device inventory, metrics, scalers."""
