"""The coordinator: requests, batching, draft-length policy, stop handling.

It owns requests and sequences and never touches tensors: it talks to the draft and target
workers through the step contract in bass.core.worker_api (in-process objects, or gRPC clients).
"""
