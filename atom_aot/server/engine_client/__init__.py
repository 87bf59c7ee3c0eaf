"""The front end's link to the engine processes: typed messages over ZMQ, one or several engines."""
