"""The real coding agents fak guard is tested against (Claude Code, Codex), pinned in
package.json here; run.py says how to run them headless, offline and quiet."""
