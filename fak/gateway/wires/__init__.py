"""One FastAPI router per wire: openai (chat/completions, completions, models), anthropic (messages), responses,
fak (the kernel's own routes), embeddings; protocol holds every wire's request bodies (pydantic models).
"""
