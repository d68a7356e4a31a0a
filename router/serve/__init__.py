"""router/serve/: the HTTP service: the loaded router, its decision log and feedback writers, metrics, the front
door, the API and its schema."""
