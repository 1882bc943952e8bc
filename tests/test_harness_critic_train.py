"""The critic inside the agent trainer (trainer/agent_train.py `--critic`): a harness fault in the
starting harness, a critic round that measures its candidate edits on the same held-out episodes
with the same policy and keeps only a significant gain, and distillation rows written for the
starting harness. The policy under test is a hand-written grounded agent (it answers only what it
read in an observation), so the harness alone decides success; distillation's SFT steps run on the
real tiny built-in model."""
from __future__ import annotations

import json
import re

import pytest
import torch

from trainer.agent_rollout import run_episode
from trainer.agent_train import AgentTrainConfig, AgentTrainer, main
from trainer.config import ConfigError, ModelConfig
from trainer.runlog import read_jsonl


class GroundedAgent:
    """Writes `get(key=...)` in call syntax for the question's key until an observation holds a
    number, then answers that number; after an error observation it answers 0."""

    def __init__(self, tok, max_len: int, loop: bool = False) -> None:
        self.tok, self.max_len, self.loop = tok, max_len, loop   # loop: never answers

    def generate(self, prompt_ids, max_new_tokens, temperature, stop):
        text = self.tok.decode(prompt_ids)
        question = text[text.rindex("Q: "):]
        seen = re.findall(r"\nT: (.*)\n", question)
        if not seen or self.loop:
            key = re.search(r"'([a-z]+)'", question).group(1)
            out = f'<tool>get(key="{key}")</tool>'
        else:
            out = f"<answer>{seen[-1] if seen[-1].isdigit() else 0}</answer>"
        return self.tok.encode(out)[:max_new_tokens]


class GroundedTrainer(AgentTrainer):
    loop = False

    def rollout(self, examples, greedy=False, policy=None):
        agent = GroundedAgent(self.policy.tok, self.policy._max_len(), loop=self.loop)
        return [run_episode(agent, self.env, ex, self.harness, greedy=greedy) for ex in examples]


def config(tmp_path, **over) -> AgentTrainConfig:
    data = {"env": "lookup", "out_dir": str(tmp_path), "name": "crit", "eval_size": 8,
            "model": ModelConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=512,
                                 learned_positions=True).model_dump(), "max_new_tokens": 64,
            "sft": {"steps": 0}, "grpo": {"steps": 0}, "harness_fault": {"tool_syntax.kind": "json"},
            "critic": {"enabled": True, "read": 12, "val_size": 16, "candidates": 3, "rounds": 2, "grpo_steps": 0,
                       "distill_steps": 2, "distill_batch": 4}}
    for k, v in over.items():
        data[k] = {**data[k], **v} if k in ("critic", "sft", "grpo") else v
    return AgentTrainConfig.parse(data)


def test_a_parser_fault_is_found_measured_kept_and_distilled_into_rows_for_the_starting_harness(tmp_path):
    t = GroundedTrainer(config(tmp_path), printer=None)
    assert t.harness.tool_syntax.kind == "json" and t.demo_harness.tool_syntax.kind == "call"
    before = [p.detach().clone() for p in t.params]
    out = t.run()
    kept = out["edits_kept"]
    assert [(e["path"], e["value"]) for e in kept] == [("tool_syntax.kind", "call")]
    assert kept[0]["before"] == 0 and kept[0]["after"] == 16 and kept[0]["p_value"] == pytest.approx(2 ** -16)
    assert kept[0]["alpha"] == 0.05 and out["edits_rejected"] == []    # one candidate: the whole alpha
    assert out["heldout_acc_before_critic"] == 0.0 and out["heldout_acc_after_edit"] == 1.0
    assert out["harness"] != out["start_harness"] and t.start_harness.tool_syntax.kind == "json"
    # the second round reads only successes: nothing to propose, the rounds end
    assert len(t.edits) == 1
    # distillation: every verified success written for the starting (json) harness and verified there
    assert out["distill_episodes"] == 8 and out["distill_successes"] == 8 and out["distill_rows"] == 8
    # the grounded agent writes call syntax whatever its weights: under the starting harness it still
    # fails, so distillation measured no gain and its weights were rolled back
    assert out["start_harness_acc_before_distill"] == 0.0 and out["start_harness_acc_after_distill"] == 0.0
    assert out["distill_steps"] == 2 and out["distill_kept"] == 0.0 and out["harness_reduced"] == 0.0
    assert out["distill_reason"].startswith("no significant gain under the starting harness")
    assert all(torch.equal(a, b) for a, b in zip(before, t.params)), "rolled back: the weights from before it"
    events = read_jsonl(tmp_path / "crit" / "events.jsonl")
    crit = next(e for e in events if e["event"] == "critique")
    assert crit["failed"] == 12 and crit["findings"][0].startswith("malformed_call: 12/12")
    edits = [e for e in events if e["event"] == "harness_edit"]
    assert [e["kept"] for e in edits] == [True] and edits[0]["harness_version"] == out["start_harness"]
    end = next(e for e in events if e["event"] == "end")
    assert end["edits_kept"][0]["path"] == "tool_syntax.kind" and end["distill_rows"] == 8
    rows = read_jsonl(tmp_path / "crit" / "metrics.jsonl")
    assert [r["algorithm"] for r in rows].count("distill") == 1 and any(r["algorithm"] == "critic" for r in rows)


class LearningTrainer(GroundedTrainer):
    """Its agent writes the starting harness's (json) syntax once distillation's SFT has taken a
    step: a policy into which the gain moves."""
    learned = False

    def sft_on(self, trajs, lr):
        out = super().sft_on(trajs, lr)
        self.learned = True
        return out

    def rollout(self, examples, greedy=False, policy=None):
        if not self.learned or policy is not None:     # the teacher writes what it wrote before
            return super().rollout(examples, greedy, policy)
        agent = GroundedAgent(self.policy.tok, self.policy._max_len())
        trajs = []
        for ex in examples:
            json_agent = JsonAgent(agent)
            trajs.append(run_episode(json_agent, self.env, ex, self.harness, greedy=greedy))
        return trajs


class JsonAgent:
    """The grounded agent's calls written as JSON (the starting harness's syntax)."""

    def __init__(self, inner: GroundedAgent) -> None:
        self.inner, self.tok, self.max_len = inner, inner.tok, inner.max_len

    def generate(self, prompt_ids, max_new_tokens, temperature, stop):
        out = self.tok.decode(self.inner.generate(prompt_ids, 10_000, temperature, stop))
        m = re.fullmatch(r'<tool>get\(key="([a-z]+)"\)</tool>', out)
        if m:
            out = '<tool>{"name": "get", "arguments": {"key": "' + m.group(1) + '"}}</tool>'
        return self.tok.encode(out)[:max_new_tokens]


def test_distillation_that_moves_the_gain_is_kept_and_the_scaffolding_removed(tmp_path):
    t = LearningTrainer(config(tmp_path), printer=None)
    out = t.run()
    assert out["edits_kept"][0]["path"] == "tool_syntax.kind" and out["distill_rows"] == 8
    assert out["distill_kept"] == 1.0 and out["harness_reduced"] == 1.0, out["distill_reason"]
    assert out["start_harness_acc_before_distill"] == 0.0 and out["start_harness_acc_after_distill"] == 1.0
    # the run is back on the starting harness, and held-out success holds there
    assert t.harness.version == t.start_harness.version and out["heldout_acc_after_distill"] == 1.0
    ev = next(e for e in read_jsonl(tmp_path / "crit" / "events.jsonl") if e["event"] == "distill")
    assert ev["distill_kept"] == 1.0 and "the scaffolding is removed" in ev["distill_reason"]


@pytest.mark.parametrize("start_before, start_after, imp_before, imp_after, kept, reduced", [
    # the gain moved into the weights and nothing was lost: kept; the starting harness holds: reduced
    ([0] * 16, [1] * 16, [1] * 16, [1] * 16, True, True),
    # moved, but the improved harness is still far better: kept, the scaffolding stays
    ([0] * 16, [1] * 8 + [0] * 8, [1] * 16, [1] * 16, True, False),
    # no gain under the starting harness: rolled back
    ([0] * 16, [0] * 16, [1] * 16, [1] * 16, False, False),
    # a gain too small to be significant at alpha 0.05 (2 of 16): rolled back
    ([0] * 16, [1] * 2 + [0] * 14, [1] * 16, [1] * 16, False, False),
    # moved, but the run's level is lost under either harness (the distillation trough): rolled back
    ([0] * 16, [1] * 8 + [0] * 8, [1] * 16, [0] * 16, False, False),
    # the weights now write what only the starting harness reads: kept, and the run goes back to it
    ([0] * 16, [1] * 16, [1] * 16, [0] * 16, True, True),
])
def test_distillation_is_judged_like_an_intervention(start_before, start_after, imp_before, imp_after, kept, reduced):
    from trainer.agent_coevolve import judge_distillation

    v = judge_distillation([bool(x) for x in start_before], [bool(x) for x in start_after],
                           [bool(x) for x in imp_before], [bool(x) for x in imp_after], 0.05)
    assert (v.kept, v.reduced) == (kept, reduced), v.reason


def test_distillation_rows_are_in_the_starting_harness_syntax(tmp_path):
    t = GroundedTrainer(config(tmp_path), printer=None)
    t.harness = t.demo_harness                      # the improved harness: call syntax
    ex = t.env.episode("train", 0, 1)
    traj = t.rollout([ex])[0]
    assert traj.reward == 1.0
    turns = t.as_demonstration(traj, t.start_harness)
    key = ex.meta["asked"][0]
    assert turns == ['<tool>{"name": "get", "arguments": {"key": "' + key + '"}}</tool>', f"<answer>{ex.answer}</answer>"]
    assert json.loads(turns[0][6:-7])["arguments"] == {"key": key}


def test_an_edit_that_does_not_help_is_rejected_with_its_numbers_and_the_harness_stays(tmp_path):
    class Looping(GroundedTrainer):
        loop = True                          # calls the tool until the turn limit, never answers

    t = Looping(config(tmp_path, harness_fault={}), printer=None)
    out = t.run()
    assert out["edits_kept"] == [] and out["harness"] == out["start_harness"] and "heldout_acc_after_edit" not in out
    [rej] = out["edits_rejected"]
    assert (rej["path"], rej["value"]) == ("max_turns", t.harness.max_turns + max(1, t.harness.max_turns // 2))
    assert (rej["before"], rej["after"], rej["gains"], rej["losses"]) == (0, 0, 0, 0) and "no gain" in rej["verdict"]


def test_without_a_fault_the_critic_finds_nothing_to_change(tmp_path):
    t = GroundedTrainer(config(tmp_path, harness_fault={}), printer=None)
    t.start()
    assert t.critic_round() is None and t.edits == []


WRONG_DESCRIPTION = "the number of keys in the table; call it once, before you answer"


class DescriptionReadingAgent(GroundedAgent):
    """The grounded agent, but it calls `get` only when the tool list says `get` returns a key's
    value; otherwise it answers 0 at once (a policy a wrong description turns away from the tool)."""

    def generate(self, prompt_ids, max_new_tokens, temperature, stop):
        text = self.tok.decode(prompt_ids)
        line = re.search(r"- get\(key: string\): (.*)\n", text)
        if line is None or "value" not in line.group(1):
            return self.tok.encode("<answer>0</answer>")[:max_new_tokens]
        return super().generate(prompt_ids, max_new_tokens, temperature, stop)


class DescriptionTrainer(AgentTrainer):
    agent = DescriptionReadingAgent

    def rollout(self, examples, greedy=False, policy=None):
        agent = self.agent(self.policy.tok, self.policy._max_len())
        return [run_episode(agent, self.env, ex, self.harness, greedy=greedy) for ex in examples]


def test_a_wrong_tool_description_is_restored_to_the_environment_declaration_on_a_measured_gain(tmp_path):
    t = DescriptionTrainer(config(tmp_path, harness_fault={"tools.get.description": WRONG_DESCRIPTION}), printer=None)
    assert t.harness.tool("get").description == WRONG_DESCRIPTION
    t.start()
    kept = t.critic_round()
    assert (kept["path"], kept["mode"]) == ("tools.get", "tool_spec_differs")
    assert (kept["before"], kept["after"], kept["gains"], kept["losses"]) == (0, 16, 16, 0)
    assert kept["alpha"] == pytest.approx(0.05 / 2) and kept["p_value"] == pytest.approx(2 ** -16)
    assert t.harness.tools == t.env.tool_specs() and t.harness.version == t.demo_harness.version
    # the other candidate, the rule to call a tool, was measured on the same episodes and gained nothing
    [rule] = [e for e in t.edits if not e["kept"]]
    assert rule["path"] == "system_prompt" and rule["gains"] == 0 and "no gain" in rule["verdict"]
    assert t.critic_round() is None                  # the next round reads only successes
    events = read_jsonl(tmp_path / "crit" / "events.jsonl")
    crit = next(e for e in events if e["event"] == "critique")
    assert crit["findings"][0].startswith("tool_spec_differs: 12/12")


def test_a_description_restore_without_a_gain_is_rejected_and_the_harness_stays(tmp_path):
    class Skipping(DescriptionReadingAgent):         # never calls the tool, whatever it is told
        def generate(self, prompt_ids, max_new_tokens, temperature, stop):
            return self.tok.encode("<answer>0</answer>")[:max_new_tokens]

    class SkippingTrainer(DescriptionTrainer):
        agent = Skipping

    t = SkippingTrainer(config(tmp_path, harness_fault={"tools.get.description": WRONG_DESCRIPTION}), printer=None)
    start = t.harness.version
    t.start()
    assert t.critic_round() is None and t.harness.version == start
    restore = next(e for e in t.edits if e["path"] == "tools.get")
    assert not restore["kept"] and (restore["before"], restore["after"]) == (0, 0) and "no gain" in restore["verdict"]


@pytest.mark.parametrize("fault, message", [
    ("max_turns=0", "harness_fault: max_turns=0"),
    ("nonsense", "write PATH=VALUE"),
    ("tools.nope.description=x", "there is no tool 'nope'"),
])
def test_a_bad_fault_is_one_clear_line(tmp_path, capsys, fault, message):
    rc = main(["--env", "lookup", "--critic", "--fault", fault, "--out", str(tmp_path), "--sft-steps", "0",
               "--grpo-steps", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_bad_fault_in_the_config_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="harness_fault: observation.cut='side'"):
        GroundedTrainer(config(tmp_path, harness_fault={"observation.cut": "side"}), printer=None)


def test_positional_demonstrations_need_a_lenient_parser_and_a_strict_one_is_found_by_the_critic(tmp_path):
    cfg = AgentTrainConfig.parse({"env": "lookup", "out_dir": str(tmp_path), "demo_calls": "positional",
                                  "harness_fault": {"tool_syntax.lenient": False}, "sft": {"steps": 0}})
    t = AgentTrainer(cfg, printer=None)
    assert t.demo_harness.tool_syntax.lenient and not t.harness.tool_syntax.lenient
    assert t.harness.system_text() == t.demo_harness.system_text()     # the fault leaves the prompt alone
    ex = t.env.episode("train", 0, 1)
    [demo] = t.demonstrations([ex])
    assert demo.reward == 1.0 and demo.steps[0].text == f'<tool>get("{ex.meta["asked"][0]}")</tool>'
    strict = run_episode(DemoGeneratorFor(t, ex), t.env, ex, t.harness)
    assert strict.steps[0].action == "malformed_call" and strict.reward == 0.0
    from harness.critic import critique
    crit = critique([strict], t.harness, t.env.tool_specs())
    assert crit.edits[0].text() == "tool_syntax.lenient=True" and crit.findings[0].detail["parse_lenient"] == 1


def DemoGeneratorFor(t, ex):
    from trainer.agent_train import DemoGenerator
    return DemoGenerator(t.policy.tok, t.demo_turns(ex, t.demo_harness), t.policy._max_len())


def test_positional_rendering_is_call_syntax_only():
    from harness.tools import ToolCallSyntax
    assert ToolCallSyntax().render("get", {"key": "a", "n": 2}, positional=True) == '<tool>get("a", 2)</tool>'
    with pytest.raises(ValueError, match="only in the call syntax"):
        ToolCallSyntax(kind="json").render("get", {"key": "a"}, positional=True)
