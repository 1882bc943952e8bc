"""The controller's memory and skill library: episodes in, skills and past outcomes out.

    k = Knowledge(ws, goal.memory, task="addition", timeline=store.log)
    skills = k.retrieve(diagnoses)                  # [(Skill, score)]: similarity × utility, logged
    eps = k.relevant_episodes(diagnoses)            # what happened to these fixes before
    k.record(iv, window)                            # an evaluated intervention → an episode
    actions = k.mine(llm=None)                      # the miner: new / updated / retired skills, as PRs

Where things live
- Skills: the workspace's git tree, `skills/<name>/SKILL.md` (+ program). A new or changed skill
  is a PR (branch `skill/<name>-v<version>`), merged once the skill verifies; a retired skill stays
  in the tree with `status: retired` (and in history).
- Memory: `memory.library` (or $SWARMLAB_LIBRARY), a user-level folder shared across workspaces,
  else `<workspace>/.swarm/memory`: `episodes.jsonl` (the log, source of truth), `retrievals.jsonl`,
  `chroma/` (the index, rebuilt from the logs and the skills when it is corrupt or short).
- With a shared library, its `skills/` folder is where skills travel between workspaces: a new
  workspace starts with the seed skills plus the library's; every skill the miner admits, updates
  or retires is copied back.
"""
from __future__ import annotations

import hashlib
import logging
import os
import pathlib
from typing import Any, Callable

log = logging.getLogger(__name__)


def _workspace_name(root: pathlib.Path) -> str:
    return f"{root.name}-{hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:6]}"


def shared_library(settings: Any) -> pathlib.Path | None:
    p = settings.library or os.environ.get("SWARMLAB_LIBRARY")
    return pathlib.Path(p).expanduser().resolve() if p else None


def skill_files(skill: Any, program: str | None = None) -> dict[str, bytes]:
    """The files of a skill as they go into git: every file of the folder it was read from
    (scripts, references, assets, licence: skills.library.skill_tree, with its path checks), then
    SKILL.md as the skill now reads and its program (`program`, else the folder's)."""
    from skills.library import is_skill_dir, skill_tree

    folder = getattr(skill, "folder", None)
    files = {f"skills/{skill.name}/{rel}": data for rel, data in skill_tree(folder).items()} \
        if folder is not None and is_skill_dir(folder) else {}
    files[f"skills/{skill.name}/SKILL.md"] = skill.to_markdown().encode()
    sw = skill.swarmlab
    if sw is not None and sw.program:
        program = program if program is not None else skill.program_source()
        if program is not None:
            files[f"skills/{skill.name}/{sw.program}"] = program.encode()
    return files


def retired(skill: Any, reason: str) -> Any:
    """`skill` marked retired (version + 1), not written anywhere."""
    from skills.skill import SwarmlabBlock

    sw = skill.swarmlab or SwarmlabBlock()
    sw = SwarmlabBlock.model_validate({**sw.model_dump(), "status": "retired", "retired_reason": reason,
                                       "version": sw.version + 1})
    return skill.model_copy(update={"swarmlab": sw})


def seed_workspace(ws: Any, settings: Any) -> list[str]:
    """Start a new workspace's skills/: the seed library (when `seed_skills`) and the shared
    library's skills, committed on main in one commit. Returns the names."""
    from skills import SkillLibrary, seed_dir

    files: dict[str, bytes] = {}
    names: list[str] = []
    sources = [SkillLibrary(seed_dir())] if settings.seed_skills else []
    lib = shared_library(settings)
    if lib is not None and (lib / "skills").is_dir():
        sources.append(SkillLibrary(lib / "skills"))      # later sources win: the library's version
    for src in sources:
        skills, errors = src.load()
        for e in errors:
            log.warning("skill library %s: %s (skipped)", src.root, e)
        for sk in skills:
            files = {k: v for k, v in files.items() if not k.startswith(f"skills/{sk.name}/")}
            files.update(skill_files(sk))
            if sk.name not in names:
                names.append(sk.name)
    if files:
        ws.commit_files(files, f"Skill library: {len(names)} skill(s) from "
                               f"{' and '.join(s for s, on in (('the seed library', settings.seed_skills), ('the shared library', lib is not None)) if on)}")
    return names


def _lock_library(root: pathlib.Path) -> int:
    """One controller at a time per memory root (chromadb's files take no cross-process lock): an
    flock the kernel drops when the holder dies. Raises ValueError naming the holder."""
    import fcntl

    from sandboxes.private import open_private_fd, private_dir

    private_dir(root)
    path = root / "memory.lock"
    fd = open_private_fd(path, os.O_RDWR)   # 0600, never a link's target: the truncation below stays here
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = path.read_text().strip() or "?"
        os.close(fd)
        raise ValueError(f"memory library {str(root)!r} is in use by another controller (pid {holder}); "
                         "runs that share a library take turns (or give this goal its own memory.library)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class Knowledge:
    def __init__(self, ws: Any, settings: Any, task: str | None, timeline: Callable[..., None] | None = None,
                 sandbox: Any = None) -> None:
        from memory import library_root
        from skills import SkillLibrary

        self.ws = ws
        self.settings = settings
        self.task = task
        self.timeline = timeline or (lambda kind, **kw: None)
        self.shared = shared_library(settings)
        self.root = library_root(ws.root, self.shared)
        self._lock = _lock_library(self.root)
        self._memory: Any = None
        self.library = SkillLibrary(ws.root / "skills")
        self.name = _workspace_name(ws.root)
        self._sandbox = sandbox
        self.skills: list[Any] = []
        self.version = 0          # bumped whenever skills or episodes change (retrieval caches key on it)
        self.reload()

    @property
    def memory(self) -> Any:
        """The memory, opened at first use: a run where nothing goes wrong never loads chromadb or
        the embedding model (seconds of CPU for the controller)."""
        if self._memory is None:
            from memory import Memory

            self._memory = Memory.open(self.root, backend=self.settings.backend)
            if self._memory.rebuilt:
                self.timeline("memory_rebuilt", reason=self._memory.rebuilt, root=str(self.root))
            self._index_skills()
        return self._memory

    @property
    def opened(self) -> bool:
        return self._memory is not None

    @property
    def sandbox(self) -> Any:
        if self._sandbox is None:
            from sandboxes import make_sandbox

            self._sandbox = make_sandbox("auto")
        return self._sandbox

    def reload(self) -> None:
        """Load the workspace's skills (a malformed one is reported and skipped) and index them."""
        skills, errors = self.library.load()
        for e in errors:
            log.warning("%s", e)
            self.timeline("skill_invalid", error=str(e))
        self.skills = skills
        self.version += 1
        if self._memory is not None:
            self._index_skills()

    def _index_skills(self) -> None:
        gone = self._memory.skill_names() - {s.name for s in self.skills}
        if gone:
            self._memory.drop_skills(sorted(gone))
        if self.skills:
            self._memory.index_skills([(s.name, s.document(), s.metadata()) for s in self.skills])

    def close(self) -> None:
        if self._memory is not None:
            self._memory.close()
        if self._sandbox is not None:
            self._sandbox.close()
        if self._lock is not None:
            os.close(self._lock)      # releases the flock
            self._lock = None

    # ---- use ------------------------------------------------------------------------------------
    def utility(self) -> dict[str, Any]:
        from skills import utility_from_episodes

        return utility_from_episodes(self.memory.episodes(), self.memory.retrievals())

    def retrieve(self, diagnoses: list[Any], n: int | None = None) -> list[tuple[Any, float]]:
        """Active skills for the findings at hand, ranked by similarity × utility; logged as retrieved."""
        from agents.recall import retrieval_text

        n = self.settings.retrieve_skills if n is None else n
        text = retrieval_text(diagnoses, self.task)
        if n <= 0 or not self.skills or not text.strip():
            return []
        hits = self.memory.search_skills(text, n=min(len(self.skills), 4 * n))
        ranked = self.library.rank([(h.id, h.distance) for h in hits], self.utility(), n=n)
        if ranked:
            self.memory.log_retrieval([s.name for s, _ in ranked], text[:300])
        return ranked

    def relevant_episodes(self, diagnoses: list[Any]) -> list[Any]:
        """Past episodes of the fixes for these findings (same diagnosis, any task), then the most
        similar others, up to `retrieve_episodes`."""
        from agents.recall import retrieval_text

        n = self.settings.retrieve_episodes
        names = sorted({d.name for d in diagnoses if d.severity != "info"})
        if n <= 0 or not names:
            return []
        same = self.memory.episodes(where={"diagnosis": {"$in": names}})
        seen = {e.id for e in same}
        similar = [e for e, _ in self.memory.similar_episodes(retrieval_text(diagnoses, self.task), n=n) if e.id not in seen]
        return (same + similar)[-max(n, len(same)):]

    def record_of(self, name: str) -> tuple[int, int, list[str]]:
        """(wins, losses, episode ids) of a skill: the episodes it was mined from and those that used it."""
        sk = next((s for s in self.skills if s.name == name), None)
        if sk is None:
            return 0, 0, []
        src = set(sk.swarmlab.episodes or []) if sk.swarmlab is not None else set()
        eps = [e for e in self.memory.episodes() if e.id in src or name in e.skills_used]
        return sum(e.won() for e in eps), sum(e.lost() for e in eps), [e.id for e in eps]

    def trusted(self, names: list[str]) -> str | None:
        """Why a fix backed by one of these skills may skip its backtest, or None: the skill is active,
        won at least `trust_after_wins` times and never lost."""
        need = self.settings.trust_after_wins
        if need <= 0:
            return None
        for name in names:
            sk = next((s for s in self.skills if s.name == name and s.active), None)
            if sk is None:
                continue
            wins, losses, ids = self.record_of(name)
            if wins >= need and losses == 0:
                return (f"skill {name!r} won {wins} time(s) and never lost (episodes {', '.join(ids[:5])}): applied on its "
                        "record; judged after applying and rolled back if worse")
        return None

    # ---- learning -------------------------------------------------------------------------------
    def record(self, iv: Any, window: dict[str, Any]) -> bool:
        """An evaluated intervention as an episode. Only measured outcomes are episodes: kept (a
        measured gain over the control, swarm.judging.judge), rolled back (credibly worse, or no
        measured gain), rejected by a backtest, or refused as a change the live trainer does not
        accept or as a fix whose backtests ran out of longer horizons (a loss: the same change is not
        tried again)."""
        from memory import Episode
        from agents.domain import Status
        from agents.operators import inconclusive

        if iv.status == Status.KEPT:
            outcome = "kept"
        elif iv.status == Status.ROLLED_BACK:
            outcome = "rolled_back"
        elif iv.status == Status.REJECTED and (iv.backtest is not None or iv.outcome.refused or iv.outcome.exhausted):
            outcome = "rejected"
        else:
            return False
        effect = iv.backtest.effect if iv.backtest is not None and not iv.outcome.refused else None
        if iv.backtest is None and isinstance(iv.outcome.after, (int, float)) and isinstance(iv.outcome.baseline, (int, float)):
            effect = float(iv.outcome.after) - float(iv.outcome.baseline)
        ep = Episode(
            id=f"{self.name}/{iv.id}", workspace=self.name, task=self.task or "", operator=iv.operator, policy=iv.policy,
            diagnosis=iv.diagnosis.name, diagnosis_summary=iv.diagnosis.summary[:500], severity=iv.diagnosis.severity,
            kind=iv.kind.value, changes=dict(iv.changes), before=dict(iv.outcome.before or {}),
            signature=iv.signature(), outcome=outcome, effect=effect,
            p_value=iv.backtest.p_value if iv.backtest is not None else None,
            metric=iv.backtest.metric if iv.backtest is not None else "heldout_acc",
            window={**(window or {}), "risk": iv.risk.value}, skills_used=list(iv.skills_used),
            worker_cpu_s=iv.outcome.backtest_cpu_s, step=iv.applied_step or iv.diagnosis.step,
            measured_nothing=outcome == "rejected" and iv.backtest is not None and not iv.outcome.refused
            and not iv.outcome.exhausted and iv.backtest.measured_nothing(),
            inconclusive=inconclusive(iv),
            time=iv.history[-1]["time"] if iv.history else iv.created)   # deterministic: re-recording is a no-op
        new = self.memory.record_episode(ep)
        self.version += new
        return new

    def record_report(self, id: str, text: str, **metadata: Any) -> None:
        """A report (an intervention's PR report, the final report) into the memory's reports collection."""
        self.memory.record_report(f"{self.name}/{id}", text, {"workspace": self.name, "task": self.task or "", **metadata})

    def mine(self, llm: Any = None) -> list[Any]:
        """Run the miner over every episode in memory; admitted skills become merged skill PRs,
        refusals are logged with their reason. Returns the miner's actions."""
        from agents.miner import SkillMiner

        miner = SkillMiner(self.settings.min_support, self.settings.retire_after_losses, self.settings.program_timeout_s)
        actions = miner.mine(self.memory.episodes(), self.skills, self.utility(), llm=llm, sandbox=self.sandbox)
        changed = False
        for a in actions:
            if a.action == "refuse":
                self.timeline("skill_refused", name=a.name, reason=a.reason, policy=a.policy)
                continue
            sk = a.skill
            if a.action == "retire":   # as a PR like any change (the work tree only moves by merging it)
                sk = retired(sk, a.reason)
            files = skill_files(sk, a.program)
            version = sk.swarmlab.version if sk.swarmlab is not None else 1
            branch = self.ws.skill_pr(sk.name, version, files,
                                      f"Skill {sk.name} v{version}: {a.action}\n\n{a.reason}\n\nmined by skill_miner ({a.policy})")
            self.timeline(f"skill_{'added' if a.action == 'add' else a.action + 'd'}", name=sk.name, version=version,
                          reason=a.reason, branch=branch, policy=a.policy)
            changed = True
        if changed:
            self.reload()
            self.export()
        return actions

    def export(self) -> int:
        """Copy the workspace's skills into the shared library's skills/ (newer versions win)."""
        from skills import SkillLibrary

        if self.shared is None:
            return 0
        dest = SkillLibrary(self.shared / "skills")
        n = 0
        for sk in self.skills:
            cur = dest.get(sk.name)
            mine_v = sk.swarmlab.version if sk.swarmlab is not None else 1
            cur_v = (cur.swarmlab.version if cur is not None and cur.swarmlab is not None else 0) if cur is not None else -1
            if cur is None or mine_v > cur_v:
                program = None
                if sk.swarmlab is not None and sk.swarmlab.program:
                    program = skill_files(sk)[f"skills/{sk.name}/{sk.swarmlab.program}"].decode()
                dest.write(sk, program)
                n += 1
        return n
