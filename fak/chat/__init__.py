"""`fak chat`: an interactive conversation with a model (in-kernel by default, or any
OpenAI-compatible server), tools under the kernel, KV reused across turns."""
