"""`swarm mcp`: the MCP tools over a real workspace, through the SDK's Client — in-process and over
stdio against the real `swarm mcp` command. Actions exist only with --allow-actions, go through
the CLI's queue (same checks, same refusals) and are recorded as done through MCP."""
from __future__ import annotations

import sys

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from swarm.mcp_server import build_server
from swarm.store import Store
from test_ui import built, template  # noqa: F401  (fixtures: a copy of a built workspace)


def data(result):
    """A tool result's structured content (the SDK wraps a list under "result")."""
    assert not result.is_error, result.content
    sc = result.structured_content
    return sc["result"] if isinstance(sc, dict) and set(sc) == {"result"} else sc


def call(server, *calls):
    async def go():
        out = []
        async with Client(server) as c:
            tools = sorted(t.name for t in (await c.list_tools()).tools)
            for name, args in calls:
                out.append(await c.call_tool(name, args))
        return tools, out
    return anyio.run(go)


def test_read_only_tools(built):
    server = build_server(workspace=built["root"])
    tools, (runs, status, ivs, waiting, review, report) = call(
        server, ("runs", {}), ("status", {}), ("interventions", {}), ("interventions", {"status": "awaiting_approval"}),
        ("review", {"id": built["awaiting"]}), ("report", {}))
    assert tools == ["interventions", "report", "review", "runs", "status"], "no actions without --allow-actions"
    (r,) = data(runs)
    assert r["run"] == "ws" and r["awaiting_approval"] == [built["awaiting"]] and r["step"] == 119
    assert r["target"]["metric"] == "heldout_acc" and r["target"]["threshold"] == 0.9 and not r["target"]["met"]
    assert {b["key"]: b["spent"] for b in r["budget"]}["steps"] == 119
    assert data(status)["open"] == [{"id": built["awaiting"], "status": "awaiting_approval", "kind": "harness_edit",
                                     "diagnosis": "truncation"}]
    assert [x["id"] for x in data(ivs)] == [built["kept"], built["awaiting"], built["rejected"]]
    assert [x["id"] for x in data(waiting)] == [built["awaiting"]]
    rv = data(review)
    assert rv["pr_state"] == "open" and f"# Intervention {built['awaiting']}" in rv["report_markdown"]
    assert "+  max_new_tokens: 12" in rv["diff"] and "untrusted" in rv["note"]
    assert data(report)["final"] is False
    _, (bad,) = call(server, ("review", {"id": "deadbeef"}))
    assert bad.is_error and "unknown intervention 'deadbeef'" in bad.content[0].text
    _, (bad,) = call(server, ("status", {"run": "nope"}))
    assert bad.is_error and "'nope'" in bad.content[0].text


def test_actions_only_with_the_flag_and_recorded_as_mcp(built):
    server = build_server(workspace=built["root"], allow_actions=True)
    tools, (ok, again, wrong, rb, stop) = call(
        server, ("approve", {"id": built["awaiting"]}), ("reject", {"id": built["awaiting"]}),
        ("approve", {"id": built["kept"]}), ("rollback", {"id": built["kept"]}), ("stop", {}))
    assert {"approve", "reject", "rollback", "stop"} <= set(tools)
    assert data(ok)["queued"] and "approve of" in data(ok)["message"]
    assert again.is_error and "already requested" in again.content[0].text, "the first decision stands"
    assert wrong.is_error and "needs status awaiting_approval" in wrong.content[0].text
    assert data(rb)["queued"] and data(stop)["message"] == "stop requested"
    with Store(built["root"]) as st:
        rows = [r for r in st.timeline() if r["kind"].startswith("human_")]
    assert [(r["kind"], r.get("id")) for r in rows] == [("human_approve", built["awaiting"]),
                                                         ("human_rollback", built["kept"]), ("human_stop", None)]
    assert all(r["by"].startswith("mcp:") for r in rows)


def test_over_stdio_with_the_real_command(built):
    params = StdioServerParameters(command=sys.executable, args=["-m", "swarm.cli", "mcp", "--workspace", str(built["root"]),
                                                                 "--allow-actions"])

    async def go():
        async with Client(params, read_timeout_seconds=60) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            st = await c.call_tool("status", {})
            ok = await c.call_tool("reject", {"id": built["awaiting"]})
            return names, st, ok
    names, st, ok = anyio.run(go)
    assert "review" in names and "approve" in names
    assert data(st)["awaiting_approval"] == [built["awaiting"]]
    assert "reject of" in data(ok)["message"]
    with Store(built["root"]) as s:
        (row,) = s.timeline(kind="human_reject")
    assert row["id"] == built["awaiting"] and row["by"].startswith("mcp:")


def test_cli_refuses_bad_options(tmp_path):
    from typer.testing import CliRunner

    from swarm.cli import app

    r = CliRunner().invoke(app, ["mcp", "--workspace", str(tmp_path)])
    assert r.exit_code == 2 and "no swarm run" in r.output
    r = CliRunner().invoke(app, ["mcp", "--workspace", "a", "--root", "b"])
    assert r.exit_code == 2 and "not both" in r.output
    with pytest.raises(ValueError, match="exactly one"):
        build_server()
