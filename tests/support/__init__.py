"""What the tests share and are not tests: fixtures' builders (ggufgen), stand-in peers and agents, the fake
upstream, helpers to drive a scheduler or a server process, the red-team corpus, and the tree's paths."""
