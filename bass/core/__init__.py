"""The foundation every other layer builds on; it imports nothing else of BASS.

`config.py`: every configuration type, validated in one place; `errors.py`: the error types
(each maps to one gRPC status); `worker_api.py`: the step contract between the coordinator and
its draft and target workers, the same in-process and over gRPC.
"""
