"""An engine core in processes of its own, and the clients that reach it over ZMQ: one engine process,
N replicas behind one client (-dp N), or the N ranks of a data-parallel-attention artifact; the front end
(async) and the offline engine (synchronously) use the same clients."""
