"""Serving: an OpenAI-compatible HTTP API (FastAPI + uvicorn) with step-level continuous batching and a
chat page. Entry points: `scratchlm.serve.server.create_app` and `scratchlm.serve.launch.run_server`
(the `scratchlm serve` command). Nothing heavy is imported here, so `import scratchlm` stays light."""

API_KEY_ENV = "SCRATCHLM_API_KEY"  # where `scratchlm serve` reads its API key when --api-key is not given
