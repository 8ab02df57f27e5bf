"""The OpenAI-compatible HTTP front: `POST /v1/completions`, `POST /v1/chat/completions`,
`GET /v1/models`, `GET /health`, translated to the coordinator's public gRPC API
(bass.v1.Generation). It holds no engine state: it is a client of the coordinator, like
`bass client`, and any number of fronts may serve one coordinator.

- `errors.py`: OpenAI-style error bodies, and gRPC status codes to HTTP statuses
- `params.py`: an OpenAI request body to a GenerateRequest (what is supported, what is refused)
- `prompts.py`: text and chat messages to token ids (the tokenizer and its chat template)
- `responses.py`: GenerateResponse / stream messages to OpenAI JSON objects and SSE chunks
- `app.py`: the Starlette routes over a grpc.aio channel (cancelling a call when its client goes)
- `server.py`: uvicorn on a bound socket, in a thread (`serve_http`) or a process (`bass http-front`)
"""
