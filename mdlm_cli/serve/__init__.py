"""`mdlm serve`: an OpenAI-compatible HTTP server for a checkpoint (docs/serving.md).

schema.py, fields.py, completion.py, chat.py and infill.py check requests into plans,
worker.py batches the network calls of concurrent requests (each with its own generator),
generation.py runs a plan, app.py is the ASGI app, metrics.py the Prometheus counters,
page.html the page at `/`."""
