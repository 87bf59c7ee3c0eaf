"""What stands around every request: body limits and keys, request ids, metrics, and when the server stops."""
