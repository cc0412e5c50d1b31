"""The wire runner: the engine's own HTTP client for the Table service (sync on
urllib3, async on aiohttp), its exchanges, OData codec, signing and connections."""
