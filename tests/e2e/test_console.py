"""The web console of `fak serve` (fak/console/, fak/gateway/console.py).

Routes first (in process, no model): the page is public and every JSON route is behind the key;
the decisions tail, its filters and the journal check; percentiles from the latency histograms;
P/D worker rows; --no-console. Then the page itself in Debian's Chromium, headless, driven by
Playwright against a real `fak serve` on Gemma 3 270M with --api-key and --journal: the key is
asked once, the chat streams a reply, a forced `rm -rf ~` call shows refused (red, with its reason)
and a forced `ls` allowed, bad input is one line, the engine charts move under a load, the
decisions table has the DENY and verifies its chain, the policy tester says DENY for `rm -rf ~` and
ALLOW for `ls`; the page fetches nothing but the server. Screenshots of each view go to
tests/artifacts/console/.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import httpx
import pytest

from support.serve_helpers import REPO, Server

pytestmark = pytest.mark.slow  # boots a model or a server per module: the full suite runs it

MODEL = "gemma3-270m"
KEY = "console-test-key"
ARTIFACTS = REPO / "tests" / "artifacts" / "console"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# a forced call (tool_choice "required") whose only possible arguments are {"command": "rm -rf ~"}
RM_TOOL = [{"type": "function", "function": {"name": "Bash", "parameters": {
    "type": "object", "properties": {"command": {"const": "rm -rf ~"}}, "required": ["command"],
    "additionalProperties": False}}}]


# ---------------------------------------------------------------------------- routes, in process
def _app(tmp_path: Path | None = None, key: str | None = KEY, console: bool = True):  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    from fak.core.journal import Journal
    from fak.core.kernel import Kernel
    from fak.core.policy import serving_floor
    from fak.gateway import create_app
    from fak.gateway.config import ServeConfig

    kernel = Kernel.with_policy(serving_floor())
    if tmp_path is not None:
        kernel.journal = Journal(tmp_path / "j.jsonl", fsync=False)
    app = create_app(lambda: None, ServeConfig("m", api_key=key, console=console), background=False, kernel=kernel)
    return TestClient(app), kernel


AUTH = {"Authorization": f"Bearer {KEY}"}


def test_page_is_public_json_routes_need_the_key() -> None:
    client, _ = _app()
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"] and "fak console" in page.text
    assert client.get("/console/app.js").status_code == 200 and client.get("/console/app.css").status_code == 200
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    for method, path in (("GET", "/v1/fak/stats"), ("GET", "/v1/fak/decisions"), ("POST", "/v1/fak/audit/verify")):
        r = client.request(method, path)
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"], path
    s = client.get("/v1/fak/stats", headers=AUTH)
    assert s.status_code == 200 and s.json()["model"] == "m" and s.json()["ttft_s"]["p50"] is None


def test_no_console_serves_no_page() -> None:
    client, kernel = _app(console=False)
    assert client.get("/").status_code == 404 and client.get("/v1/fak/stats", headers=AUTH).status_code == 404
    assert kernel.journal is None  # no tap either


@pytest.mark.serve
def test_no_console_flag() -> None:
    s = Server("--gguf", "synthetic", "--no-console")
    try:
        assert httpx.get(s.url + "/", timeout=10).status_code == 404
        assert httpx.get(s.url + "/v1/fak/stats", timeout=10).status_code == 404
        assert httpx.get(s.url + "/fak/stats", timeout=10).status_code == 200  # the rest of the server is there
    finally:
        assert s.stop() == 0


def test_decisions_tail_filters_and_keeps_pre_kernel_refusals(tmp_path: Path) -> None:
    from fak.core.abi import ToolCall
    from fak.gateway.toolgate import decide

    client, kernel = _app(tmp_path)
    kernel.submit(ToolCall("tool", "Bash", args=b'{"command": "rm -rf ~"}'))
    kernel.submit(ToolCall("tool", "Bash", args=b'{"command": "ls"}'))
    decide(kernel, "Nope", b"{}", frozenset({"Bash"}))  # refused by the gateway, before the kernel
    rows = client.get("/v1/fak/decisions", headers=AUTH).json()
    assert rows["seen"] == 3 and rows["journal"] == str(tmp_path / "j.jsonl")
    assert [(d["tool"], d["verdict"], d["reason"]) for d in rows["decisions"]] == [
        ("Nope", "DENY", "UNKNOWN_TOOL"), ("Bash", "ALLOW", "NONE"), ("Bash", "DENY", "POLICY_BLOCK")]
    assert rows["decisions"][2]["detail"].startswith("delete ") and rows["decisions"][2]["by"] == "policy:coding-floor"
    deny = client.get("/v1/fak/decisions?verdict=DENY&tool=bash", headers=AUTH).json()["decisions"]
    assert [d["reason"] for d in deny] == ["POLICY_BLOCK"]
    assert len(client.get("/v1/fak/decisions?limit=1", headers=AUTH).json()["decisions"]) == 1
    for bad in ("limit=0", "limit=abc", "verdict=MAYBE", "tool="):
        r = client.get(f"/v1/fak/decisions?{bad}", headers=AUTH)
        assert r.status_code == 400 and r.json()["error"]["message"].count("\n") == 0, bad


def test_verify_is_the_audit_check(tmp_path: Path) -> None:
    from fak.core.abi import ToolCall

    client, kernel = _app(tmp_path)
    kernel.submit(ToolCall("tool", "Bash", args=b'{"command": "rm -rf ~"}'))
    kernel.submit(ToolCall("tool", "Bash", args=b'{"command": "ls"}'))
    ok = client.post("/v1/fak/audit/verify", headers=AUTH).json()
    assert ok["ok"] is True and ok["records"] == 2 and ok["summary"].endswith("OK, 2 records")
    path = tmp_path / "j.jsonl"
    path.write_bytes(path.read_bytes().replace(b'"DENY"', b'"ALLOW"', 1))  # a refusal rewritten as an allow
    bad = client.post("/v1/fak/audit/verify", headers=AUTH).json()
    assert bad["ok"] is False and bad["bad_line"] == 1 and "hash mismatch" in bad["problem"]
    none, _ = _app()
    r = none.post("/v1/fak/audit/verify", headers=AUTH)
    assert r.status_code == 404 and "--journal" in r.json()["error"]["message"]


def test_stats_has_one_row_per_worker_under_pd_and_stages() -> None:
    from types import SimpleNamespace

    from fastapi.testclient import TestClient

    from engine.pipeline.metrics import pipeline_stats
    from engine.sched.api import Topology
    from engine.sched.stats import SchedStats
    from fak.gateway import create_app
    from fak.gateway.config import ServeConfig

    pd = {"prefill": {"role": "prefill", "up": True, "requests": 3}, "router": {"prefix": 1},
          "decode0": {"role": "decode", "up": True, "imports": 2}, "decode1": {"role": "decode", "up": False}}
    stages = [{"layers": [0, 9], "steps": 4, "utilisation": 0.5}, {"layers": [9, 18], "steps": 4, "utilisation": 0.25}]
    pipeline = SimpleNamespace(stats={"decode_forwards": 0, "decode_bytes": 0, "decode_header_bytes": 0},
                               micro_batches=2, transport="shm", stage_stats=lambda fresh=False: stages)
    topo = Topology("pd", pd=lambda: pd, pipeline=lambda: pipeline_stats(pipeline))  # both splits: both kinds of rows
    sched = SimpleNamespace(stats=lambda: SchedStats(used_blocks=5, max_blocks=64, prefix_queries=4, prefix_hits=1),
                            topology=lambda: topo, collectors=lambda: [], tokenizer=None, on_finish=None)
    booted = SimpleNamespace(scheduler=sched, tokenizer=None, model=SimpleNamespace(config=SimpleNamespace(arch="x")))
    app = create_app(lambda: booted, ServeConfig("m", console=True), background=False)
    s = TestClient(app).get("/v1/fak/stats").json()
    assert [(w["name"], w["role"], w.get("up")) for w in s["workers"]] == [
        ("prefill", "prefill", True), ("decode0", "decode", True), ("decode1", "decode", False),
        ("stage0", "stage", None), ("stage1", "stage", None)]
    assert s["workers"][4]["layers"] == [9, 18]
    assert s["kv"] == {"used": 5, "cached": 0, "budget": 64, "growable": False} and s["prefix_hit_rate"] == 0.25


def test_histogram_quantiles_interpolate_within_buckets() -> None:
    from prometheus_client import CollectorRegistry, Histogram

    from fak.gateway.console import histogram_quantiles

    h = Histogram("x_seconds", "x", ["m"], buckets=(0.1, 0.2, 0.4), registry=CollectorRegistry())
    assert histogram_quantiles(h) == {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None}
    for v in [0.05] * 5 + [0.15] * 4 + [0.3]:
        h.labels("a").observe(v)
    q = histogram_quantiles(h)
    assert q["count"] == 10 and q["p50"] == pytest.approx(0.1)  # rank 5 = all of the first bucket
    assert q["p90"] == pytest.approx(0.2) and q["p99"] == pytest.approx(0.2 + 0.2 * 0.9)
    h.labels("a").observe(9.0)  # past the last bound: reported as that bound
    assert histogram_quantiles(h)["p99"] == pytest.approx(0.4)


# ---------------------------------------------------------------------------- the page, in Chromium
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    journal = tmp_path_factory.mktemp("console") / "journal.jsonl"
    s = Server("--gguf", MODEL, "--api-key", KEY, "--journal", str(journal))
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def browser():  # type: ignore[no-untyped-def]
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}: `apt-get install -y chromium` (the README test command does)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra: pip install -e '.[test]'")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(browser, server: Server):  # type: ignore[no-untyped-def]
    """One tab for the module: the key is asked for once, on the first JSON call, and kept."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg = browser.new_page(viewport={"width": 1280, "height": 860})
    errors: list[str] = []
    urls: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" and not _expected_4xx(m.text) else None)
    pg.on("request", lambda r: urls.append(r.url))
    pg.goto(server.url + "/#engine")
    pg.wait_for_selector("#keyform:not([hidden])", timeout=15000)  # the stats poll got a 401
    pg.fill("#key", "wrong")
    pg.click("#keyform button")
    pg.wait_for_selector("#key-error:has-text('refused')", timeout=10000)
    pg.fill("#key", KEY)
    pg.click("#keyform button")
    pg.wait_for_selector("#keyform", state="hidden")
    yield pg
    assert errors == [], errors  # no script error, no CSP violation on any view
    assert urls and all(u.startswith(server.url + "/") for u in urls), {u for u in urls if not u.startswith(server.url)}
    pg.close()


def _expected_4xx(text: str) -> bool:  # Chromium logs every 4xx; the tests provoke 401s and 400s on purpose
    return text.startswith("Failed to load resource: the server responded with a status of 4")


def _shot(pg, name: str) -> None:  # type: ignore[no-untyped-def]
    pg.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def _settings(pg, *, max_tokens: int, temperature: float = 0.0, tools: list | None = None,  # type: ignore[no-untyped-def]
              choice: str = "auto", system: str = "") -> None:
    pg.goto(pg.url.split("#")[0] + "#chat")
    pg.fill("#system", system)
    pg.fill("#temperature", str(temperature))
    pg.fill("#max-tokens", str(max_tokens))
    pg.fill("#tools", json.dumps(tools) if tools else "")
    pg.select_option("#tool-choice", choice)


@pytest.mark.serve
@pytest.mark.gemma
def test_stats_route_is_401_without_the_key(server: Server) -> None:
    assert httpx.get(server.url + "/v1/fak/stats", timeout=10).status_code == 401
    ok = httpx.get(server.url + "/v1/fak/stats", headers=AUTH, timeout=10)
    assert ok.status_code == 200 and ok.json()["sched"] is not None and ok.json()["kv"]["budget"] > 0
    assert httpx.get(server.url + "/", timeout=10).status_code == 200  # the page itself asks for the key


@pytest.mark.serve
@pytest.mark.gemma
@pytest.mark.browser
def test_chat_streams_a_reply(page) -> None:  # type: ignore[no-untyped-def]
    assert page.evaluate("sessionStorage.getItem('fak.apiKey')") == KEY  # kept in the tab's session storage
    page.goto(page.url.split("#")[0] + "#chat")
    page.reload()
    page.wait_for_function("() => samples.length >= 2", timeout=10000)  # two stats polls answered with the kept key
    assert page.is_hidden("#keyform")  # asked once
    _settings(page, max_tokens=16, system="You are brief.")
    # every text the reply bubble shows, as it changes (a streamed reply grows in several steps)
    page.evaluate("""() => { window.__texts = [];
        new MutationObserver((ms) => { for (const m of ms) for (const n of m.addedNodes)
            if (n.nodeType === 3 && n.parentElement && n.parentElement.closest('.msg.assistant.streaming'))
                window.__texts.push(n.data); }).observe(document.querySelector('#messages'),
            {subtree: true, childList: true}); }""")
    page.fill("#prompt", "Write one sentence about the sea.")
    page.press("#prompt", "Enter")
    page.wait_for_selector(".msg.assistant:not(.streaming) .meta:has-text('tokens')", timeout=60000)
    texts = page.evaluate("window.__texts")
    final = page.inner_text(".msg.assistant .text")
    assert final.strip() and page.inner_text(".msg.assistant .meta") == "16 tokens"
    assert len(set(texts)) >= 3 and texts[-1] == final, texts  # it grew while streaming, to the final text
    assert all(final.startswith(t) for t in texts)
    assert page.inner_text("#chat-error") == ""
    _shot(page, "chat")


@pytest.mark.serve
@pytest.mark.gemma
@pytest.mark.browser
def test_forced_destructive_call_shows_refused_with_reason(page) -> None:  # type: ignore[no-untyped-def]
    page.click("#clear")
    _settings(page, max_tokens=64, tools=RM_TOOL, choice="required")
    page.fill("#prompt", "Clean up my home directory.")
    page.press("#prompt", "Enter")
    card = page.wait_for_selector(".msg.assistant .call.refused", timeout=60000)
    text = card.inner_text()
    assert "DENY" in text and "Bash" in text and "POLICY_BLOCK" in text and "delete ~ (home) by floor.delete-home" in text
    assert "policy:coding-floor" in text
    color = card.evaluate("e => getComputedStyle(e).color")
    assert color == "rgb(185, 28, 28)"  # red
    page.wait_for_selector(".msg.assistant:not(.streaming)")
    assert "[fak] refused Bash: POLICY_BLOCK" in page.inner_text(".msg.assistant .text")  # the in-band note
    assert page.query_selector(".msg.assistant pre.tool-call") is None  # nothing reached the client
    _shot(page, "chat-refused")


@pytest.mark.serve
@pytest.mark.gemma
@pytest.mark.browser
def test_forced_harmless_call_shows_allowed(page) -> None:  # type: ignore[no-untyped-def]
    page.click("#clear")
    bare = [{"name": "Bash", "parameters": {"type": "object", "properties": {"command": {"const": "ls"}},  # no wrapper
                                            "required": ["command"], "additionalProperties": False}}]
    _settings(page, max_tokens=64, tools=bare, choice="required")
    page.fill("#prompt", "List the files here.")
    page.press("#prompt", "Enter")
    card = page.wait_for_selector(".msg.assistant .call.allowed", timeout=60000)
    assert "ALLOW" in card.inner_text() and "Bash" in card.inner_text()
    call = page.wait_for_selector(".msg.assistant pre.tool-call")  # what the client received
    assert json.loads(call.inner_text().removeprefix("Bash ")) == {"command": "ls"}
    assert page.query_selector(".msg.assistant .call.refused") is None
    page.click("#clear")


@pytest.mark.serve
@pytest.mark.gemma
@pytest.mark.browser
def test_chat_bad_input_is_one_line(page) -> None:  # type: ignore[no-untyped-def]
    page.click("#clear")
    _settings(page, max_tokens=16, tools=None)
    page.fill("#tools", "[{not json")
    page.fill("#prompt", "hi")
    page.press("#prompt", "Enter")
    page.wait_for_selector("#chat-error:has-text('tools: not valid JSON')")
    assert page.query_selector(".msg") is None  # nothing sent
    page.fill("#tools", "")
    page.fill("#max-tokens", "0")
    page.fill("#prompt", "hi")
    page.press("#prompt", "Enter")
    err = page.wait_for_selector("#chat-error:has-text('max_tokens')").inner_text()
    assert "\n" not in err and "500" not in err  # the server's 400, one line
    page.wait_for_selector(".msg.assistant.failed:has-text('(no reply)')")
    page.click("#clear")


@pytest.mark.serve
@pytest.mark.gemma
@pytest.mark.browser
def test_engine_charts_move_under_load(page, server: Server) -> None:  # type: ignore[no-untyped-def]
    page.goto(page.url.split("#")[0] + "#engine")
    page.wait_for_selector("canvas#chart-tps[data-samples]", timeout=10000)
    before = page.evaluate("document.querySelector('#chart-tps').toDataURL()")
    base = httpx.get(server.url + "/v1/fak/stats", headers=AUTH, timeout=10).json()["sched"]["tokens_generated"]
    done, made = threading.Event(), []

    def load() -> None:  # four concurrent completions, bounded
        def one(i: int) -> None:
            r = httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=120,
                           json={"prompt": f"Story {i}: once upon a time", "max_tokens": 96, "temperature": 0})
            made.append(r.json()["usage"]["completion_tokens"])
        ts = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        done.set()

    threading.Thread(target=load, daemon=True).start()
    value = "e => Number(document.querySelector(e).dataset.value || 0)"
    page.wait_for_function(f"() => ({value})(\"[data-chart=lanes] [data-series=running]\") >= 2", timeout=60000)
    page.wait_for_function(f"() => ({value})(\"[data-chart=tps] [data-series='tok/s']\") > 0", timeout=60000)
    page.wait_for_function(f"() => ({value})(\"[data-chart=kv] [data-series=used]\") > 0", timeout=60000)
    n0 = int(page.get_attribute("#chart-tps", "data-samples"))
    page.wait_for_function(f"() => Number(document.querySelector('#chart-tps').dataset.samples) > {n0}", timeout=5000)
    _shot(page, "engine")
    assert page.evaluate("document.querySelector('#chart-tps').toDataURL()") != before  # the lines moved
    assert done.wait(120)
    page.wait_for_function(f"() => ({value})(\"[data-chart=ttft] [data-series=p50]\") > 0", timeout=10000)
    assert len(made) == 4
    page.wait_for_function(f"() => Number(document.querySelector(\".tile:nth-child(1) b\").innerText) >= {base + sum(made)}",
                           timeout=5000)
    assert page.inner_text(".tile:nth-child(1) span") == "tokens generated"


@pytest.mark.serve
@pytest.mark.gemma
@pytest.mark.browser
def test_engine_view_has_a_row_per_worker(page, server: Server) -> None:  # type: ignore[no-untyped-def]
    real = httpx.get(server.url + "/v1/fak/stats", headers=AUTH, timeout=10).json()
    real["workers"] = [{"name": "prefill", "role": "prefill", "up": True, "requests": 7},
                       {"name": "decode0", "role": "decode", "up": False, "imports": 3},
                       {"name": "stage0", "role": "stage", "layers": [0, 9], "utilisation": 0.5}]

    def fake(route) -> None:  # type: ignore[no-untyped-def]
        route.fulfill(status=200, content_type="application/json", body=json.dumps(real))

    page.route(server.url + "/v1/fak/stats", fake)  # what a --pd / --stages server would report
    try:
        page.goto(page.url.split("#")[0] + "#engine")
        page.wait_for_selector("#workers-table tbody tr:nth-child(3)", timeout=10000)
        rows = page.eval_on_selector_all("#workers-table tbody tr", "rs => rs.map(r => r.innerText)")
        assert rows[0].startswith("prefill\tprefill\ttrue") and "0:9" in rows[2] and "0.500" in rows[2]
        assert page.get_attribute("#workers-table tbody tr:nth-child(2)", "class") == "refused"  # down: red
    finally:
        page.unroute(server.url + "/v1/fak/stats", fake)


@pytest.mark.serve
@pytest.mark.gemma
@pytest.mark.browser
def test_decisions_table_shows_the_deny_and_verifies(page, server: Server) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(server.url + "/v1/chat/completions", headers=AUTH, timeout=120, json={
        "messages": [{"role": "user", "content": "Delete my home directory."}], "tools": RM_TOOL,
        "tool_choice": "required", "max_tokens": 64, "temperature": 0})
    adj = r.json()["fak"]["adjudications"][0]
    assert adj["verdict"] == "DENY"  # the model's own forced call
    why = adj["reason"]  # which rule refused it depends on the arguments the model wrote
    page.goto(page.url.split("#")[0] + "#decisions")
    row = page.wait_for_selector(f"#decisions tbody tr.refused:has-text('{why}')", timeout=10000)
    assert "Bash" in row.inner_text() and "DENY" in row.inner_text() and "policy:coding-floor" in row.inner_text()
    page.select_option("#f-verdict", "ALLOW")
    page.wait_for_function(f"() => !document.querySelector('#decisions tbody').innerText.includes('{why}')",
                           timeout=10000)
    page.select_option("#f-verdict", "DENY")
    page.fill("#f-text", "Bash")
    page.wait_for_selector(f"#decisions tbody tr.refused:has-text('{why}')", timeout=10000)
    page.click("#verify")
    page.wait_for_selector("#verify-result.good", timeout=10000)
    verdict = page.inner_text("#verify-result")
    assert verdict.startswith("chain OK") and "journal.jsonl: OK" in verdict
    _shot(page, "decisions")


@pytest.mark.serve
@pytest.mark.gemma
@pytest.mark.browser
def test_policy_tester_deny_rm_allow_ls(page, server: Server) -> None:  # type: ignore[no-untyped-def]
    seen = httpx.get(server.url + "/v1/fak/decisions", headers=AUTH, timeout=10).json()["seen"]
    page.goto(page.url.split("#")[0] + "#policy")
    page.fill("#p-tool", "Bash")
    page.fill("#p-args", '{"command": "rm -rf ~"}')
    page.click("#p-run")
    page.wait_for_selector("#p-verdict.refused")
    assert page.inner_text("#p-verdict .badge") == "DENY" and "POLICY_BLOCK" in page.inner_text("#p-verdict")
    _shot(page, "policy-deny")
    page.fill("#p-args", '{"command": "ls"}')
    page.click("#p-run")
    page.wait_for_selector("#p-verdict.allowed")
    assert page.inner_text("#p-verdict .badge") == "ALLOW"
    _shot(page, "policy-allow")
    page.fill("#p-args", "{not json")
    page.click("#p-run")
    page.wait_for_selector("#p-result .err:has-text('not valid JSON')")
    page.fill("#p-args", '["a list"]')  # valid JSON, not an object: the server's one-line 400
    page.click("#p-run")
    err = page.wait_for_selector("#p-result .err").inner_text()
    assert "arguments" in err and "\n" not in err
    assert httpx.get(server.url + "/v1/fak/decisions", headers=AUTH, timeout=10).json()["seen"] == seen  # dry runs
