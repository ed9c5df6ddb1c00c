"""The three wires `fak guard` proxies, each finding the tool calls in a reply and rewriting the refused ones:
anthropic (Messages, Claude Code), chat (OpenAI chat/completions), responses (OpenAI Responses, Codex).
"""
