"""Both ends of the worker contract over gRPC, and what every BASS server shares.

Server side: `grpc_server.py` (error-to-status interceptor, health, reflection, graceful stop),
`worker_servicer.py` (the handlers both workers share), `worker_session.py` (the server end of
the `Session` stream). Client side, used by the coordinator: `remote.py` (the workers' gRPC
clients), `remote_pair.py` (a co-located pair's step as one call), `remote_session.py` (the
client end of the `Session` stream). `wire.py` converts the contract (bass.core.worker_api) to
and from protobuf (bass.v1). Nothing here touches a model or a tensor.
"""
