"""`fak guard -- AGENT`: a private gateway between a coding agent and its model provider; every tool
call in the model's replies is adjudicated by the kernel before the agent sees it, every tool result
the agent sends back passes the kernel's result admitters before the model sees it."""
