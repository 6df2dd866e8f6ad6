"""Serving: an OpenAI-compatible HTTP API (FastAPI + uvicorn) with step-level continuous batching and a
chat page. Entry points: `scratchlm.serve.server.create_app` and `scratchlm.serve.launch.run_server`
(the `scratchlm serve` command). Nothing is imported here, so `import scratchlm` stays light."""
