"""The experiment workspace: a git repository whose pull requests are interventions.

    ws = Workspace.init("ws", goal_yaml_text, recipe={...}, harness={...})
    branch = ws.open_pr(iv, report_md, {"metrics.png": png})   # "iv/<id>-<kind>"
    print(ws.diff(iv.id))
    sha = ws.approve(iv.id)      # merge --no-ff into main; main's recipe.yaml now has the change
    ws.rollback(iv.id)           # revert -m 1 of that merge
    ws.reject(other.id)          # close: branch deleted, tag closed/<id> keeps its history

Layout of the repository (branch `main`):

    goal.yaml  recipe.yaml  harness.yaml  skills/  reports/<id>/REPORT.md  .gitignore
    .swarm/    sqlite state, locks, checkpoints (ignored by git; see swarm/store.py)

A PR is a branch `iv/<id>-<kind>` holding one commit on top of main: the recipe/harness files
with `iv.changes` applied (dotted `recipe.*`/`harness.*` keys, validated against `Recipe` and
`HarnessSpec` before anything is written), `reports/<id>/REPORT.md`, its attachments, and
`reports/<id>/intervention.json` (the intervention as proposed). The state of a PR lives in refs,
so it survives crashes and is visible with plain git:

    open      branch iv/<id>-<kind> exists, not merged
    merged    tag merged/<id> on the merge commit (or, after a crash before tagging, the branch
              tip reachable from main)
    reverted  tag reverted/<id> on the rollback commit (or a main commit saying it reverts the merge)
    closed    tag closed/<id> on the rejected branch's tip; the branch itself is deleted

How:
- `open_pr` never touches the work tree or `.git/index`: blobs, a private index file
  (`GIT_INDEX_FILE`), `write-tree`, a commit object and a compare-and-swap `update-ref`. A reader
  of main's files (the controller, a user's shell) sees nothing move.
- `approve` and `rollback` change main and so run `git merge --no-ff` / `git revert -m 1` in the
  work tree, which must have main checked out. Interventions edit neighbouring lines of the same
  YAML files, so a textual conflict is likely when main moved since the PR opened; the changes are
  dotted keys, so they are re-applied onto the current main instead ("update branch": a commit
  with parents [tip, main], then the merge is trivial). A rollback that conflicts textually is
  done the same way: each key this intervention set, and nothing later changed again, goes back to
  its value before the merge. A rollback keeps `reports/<id>/` on main (only recipe/harness
  changes are reverted), so the record of what was tried stays.
- Every operation that changes refs or the work tree holds `.swarm/git.lock` (a blocking flock),
  so the controller and a CLI command in another terminal never interleave.
- Bad requests (unknown id, approving twice, rejecting a merged PR, rolling back an unmerged one)
  raise ValueError before anything is written.
- Pushes go to a remote named `origin` only when `push=True` and such a remote exists; a failed
  push is logged and kept in `push_errors`, never undoes local state.
"""
from __future__ import annotations

import contextlib
import copy
import fcntl
import io
import logging
import os
import pathlib
import re
import tempfile
import time
from typing import Any, Iterator

import git
import yaml
from gitdb.base import IStream

from agents.domain import Intervention, InterventionKind
from harness.spec import HarnessSpec
from sandboxes.private import open_private_fd, private_dir, write_private
from sandboxes.text import clean_text
from swarm.store import SWARM_DIR, intervention_from_json, intervention_json
from trainer.config import apply_changes, del_dotted, get_dotted, parse_yaml, put_dotted, validate_section

log = logging.getLogger(__name__)

MAIN = "main"
FILES = {"goal": "goal.yaml", "recipe": "recipe.yaml", "harness": "harness.yaml"}
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_ATTACH_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_RESERVED = {"REPORT.md", "intervention.json"}
_IDENTITY = ("swarmlab", "swarmlab@localhost")


GIT_UMASK = 0o077   # in git's own processes only: what git writes (objects, refs, checkouts) is 0600 / 0700


class _PrivateGit(git.Git):
    """Every git command of a workspace runs with umask 077, set in the child process (the
    controller's own umask, shared by its threads, is left alone): `.git`, the files a merge or a
    revert checks out and the objects it stores are private whatever the user's umask."""

    def execute(self, command: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("umask", GIT_UMASK)
        return super().execute(command, *args, **kwargs)


class _Repo(git.Repo):
    GitCommandWrapperType = _PrivateGit


def _write_tree_file(root: pathlib.Path, rel: str, data: str | bytes) -> None:
    """Write a work-tree file of the workspace: missing folders 0700, the file 0600 (atomic, never
    through a link), whatever the umask."""
    path = root / rel
    missing = []
    d = path.parent
    while d != root and not os.path.lexists(d):
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        private_dir(d)
    write_private(path, data)


def _dump_yaml(d: dict[str, Any]) -> str:
    return yaml.safe_dump(d, sort_keys=False, default_flow_style=False, allow_unicode=True)


def _check_id(id: str) -> None:
    if not isinstance(id, str) or not _ID_RE.match(id):
        raise ValueError(f"intervention id {id!r} is not usable in a branch name "
                         f"(letters, digits, '_' and '-', at most 64)")


class Workspace:
    """A swarm workspace: the git repository at `root` plus its `.swarm/` state folder."""

    def __init__(self, root: str | os.PathLike, push: bool = False) -> None:
        self.root = pathlib.Path(root).resolve()
        try:
            self.repo = _Repo(self.root)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise ValueError(f"{str(self.root)!r} is not a git repository") from None
        self.repo.git.update_environment(GIT_EDITOR="true", GIT_TERMINAL_PROMPT="0", GIT_MERGE_AUTOEDIT="no")
        _ensure_identity(self.repo)
        self.push = push
        self.push_errors: list[str] = []
        self._parsed: dict[tuple[str, str], dict[str, Any]] = {}
        private_dir(self.swarm_dir)             # state, logs and the private goal: 0700 whatever the umask
        private_dir(self.swarm_dir / "private")

    # ---- creation -----------------------------------------------------------------------------
    @classmethod
    def init(cls, dir: str | os.PathLike, goal_yaml_text: str, recipe: dict[str, Any],
             harness: dict[str, Any], push: bool = False) -> "Workspace":
        """Create the workspace at `dir` (a new git repository unless `dir` already is one, then
        on its `main` branch). Refuses a directory that already holds a workspace."""
        root = pathlib.Path(dir)
        try:
            goal = yaml.safe_load(goal_yaml_text)
        except yaml.YAMLError as e:
            raise ValueError(f"goal is not valid YAML: {str(e).splitlines()[0]}") from None
        if not isinstance(goal, dict):
            raise ValueError(f"goal must be a YAML mapping, got {type(goal).__name__}")
        validate_section("recipe", recipe)
        validate_section("harness", harness)
        if not os.path.lexists(root):
            root.parent.mkdir(parents=True, exist_ok=True)
            private_dir(root)                   # a folder made here: 0700 (an existing one keeps its mode)
        try:
            repo = _Repo(root)
        except git.InvalidGitRepositoryError:
            repo = _Repo.init(root, initial_branch=MAIN)   # .git made under umask 077: 0700 / 0600
        _ensure_identity(repo)
        if not repo.head.is_valid():
            repo.git.symbolic_ref("HEAD", f"refs/heads/{MAIN}")   # an empty repo made with another default
        elif repo.head.is_detached or repo.active_branch.name != MAIN:
            raise ValueError(f"{str(root)!r} is a git repository not on branch {MAIN!r}; check out {MAIN} first")
        elif FILES["goal"] in repo.head.commit.tree:
            raise ValueError(f"{str(root)!r} already holds a swarm workspace; open it instead")
        files = {FILES["goal"]: goal_yaml_text if goal_yaml_text.endswith("\n") else goal_yaml_text + "\n",
                 FILES["recipe"]: _dump_yaml(recipe), FILES["harness"]: _dump_yaml(harness),
                 "skills/.gitkeep": "", "reports/.gitkeep": ""}
        private_dir(root / "skills")            # skill programs: 0700 whatever the umask
        private_dir(root / "reports")           # the workspace's own files: 0700 / 0600 whatever the umask
        for rel, text in files.items():
            _write_tree_file(root, rel, text)
        gi = root / ".gitignore"
        lines = gi.read_text().splitlines() if gi.exists() else []
        if f"{SWARM_DIR}/" not in lines and SWARM_DIR not in lines:
            write_private(gi, "\n".join(lines + [f"{SWARM_DIR}/"]) + "\n")
        private_dir(root / SWARM_DIR)
        private_dir(root / SWARM_DIR / "private")
        repo.git.add("--", *files, ".gitignore")
        repo.git.commit("-m", "Workspace: goal, recipe and harness", "--", *files, ".gitignore")
        return cls(root, push=push)

    @classmethod
    def open(cls, dir: str | os.PathLike, push: bool = False) -> "Workspace":
        ws = cls(dir, push=push)
        if MAIN not in ws.repo.heads or FILES["goal"] not in ws.repo.heads[MAIN].commit.tree:
            raise ValueError(f"{str(ws.root)!r} is not a swarm workspace (no {FILES['goal']} on {MAIN})")
        return ws

    # ---- reading main -------------------------------------------------------------------------
    @property
    def swarm_dir(self) -> pathlib.Path:
        return self.root / SWARM_DIR

    @property
    def main(self) -> git.Commit:
        return self.repo.heads[MAIN].commit

    def _read(self, commit: git.Commit, path: str) -> bytes | None:
        try:
            return (commit.tree / path).data_stream.read()
        except KeyError:
            return None

    def _yaml_at(self, commit: git.Commit, path: str) -> dict[str, Any]:
        key = (commit.hexsha, path)       # a commit's files never change: parse each once
        if key not in self._parsed:
            raw = self._read(commit, path)
            self._parsed[key] = (parse_yaml(raw) or {}) if raw is not None else {}
            if len(self._parsed) > 64:
                self._parsed.pop(next(iter(self._parsed)))
        return copy.deepcopy(self._parsed[key])

    def current_recipe(self) -> dict[str, Any]:
        """recipe.yaml as committed on main (not the work tree)."""
        return self._yaml_at(self.main, FILES["recipe"])

    def current_harness(self) -> dict[str, Any]:
        return self._yaml_at(self.main, FILES["harness"])

    def goal_text(self) -> str:
        return (self._read(self.main, FILES["goal"]) or b"").decode()

    # ---- PR state -----------------------------------------------------------------------------
    def _branch(self, id: str) -> git.Head | None:
        names = {f"iv/{id}-{k.value}" for k in InterventionKind}
        for h in self.repo.heads:
            if h.name in names:
                return h
        return None

    def _tag(self, name: str) -> git.TagReference | None:
        return self.repo.tags[name] if name in self.repo.tags else None

    def _is_ancestor(self, a: git.Commit, b: git.Commit) -> bool:
        return self.repo.is_ancestor(a, b)

    def _merge_commit(self, id: str) -> git.Commit | None:
        t = self._tag(f"merged/{id}")
        if t is not None:
            return t.commit
        br = self._branch(id)
        if br is None or not self._is_ancestor(br.commit, self.main):
            return None
        for c in self.repo.iter_commits(MAIN, first_parent=True):   # tagging was interrupted
            if len(c.parents) == 2 and c.parents[1] == br.commit:
                return c
        return None

    def _revert_commit(self, id: str, merge: git.Commit) -> git.Commit | None:
        t = self._tag(f"reverted/{id}")
        if t is not None:
            return t.commit
        needle = f"This reverts commit {merge.hexsha}"
        for c in self.repo.iter_commits(f"{merge.hexsha}..{MAIN}", first_parent=True):
            if needle in c.message:
                return c
        return None

    def pr_state(self, id: str) -> str:
        """"open" | "merged" | "reverted" | "closed"; ValueError for an id with no PR."""
        _check_id(id)
        merge = self._merge_commit(id)
        if merge is not None:
            return "reverted" if self._revert_commit(id, merge) is not None else "merged"
        if self._tag(f"closed/{id}") is not None:
            return "closed"
        if self._branch(id) is not None:
            return "open"
        raise ValueError(f"unknown intervention {id!r}: no PR for it in workspace {str(self.root)!r}")

    def prs(self) -> list[dict[str, str]]:
        """Every PR: id, branch (or tag, when closed) and state."""
        ids: dict[str, str] = {}
        for h in self.repo.heads:
            m = re.match(r"^iv/(.+)-([a-z_]+)$", h.name)
            if m and m.group(2) in {k.value for k in InterventionKind}:
                ids[m.group(1)] = h.name
        for t in self.repo.tags:
            if t.name.startswith("closed/"):
                ids.setdefault(t.name.split("/", 1)[1], t.name)
        return [{"id": i, "ref": ref, "state": self.pr_state(i)} for i, ref in sorted(ids.items())]

    def _tip(self, id: str) -> git.Commit:
        br = self._branch(id)
        if br is not None:
            return br.commit
        t = self._tag(f"closed/{id}")
        assert t is not None, f"intervention {id}: no branch and no closed tag"
        return t.commit

    def intervention(self, id: str) -> Intervention:
        """The intervention as recorded in its PR."""
        self.pr_state(id)
        raw = self._read(self._tip(id), f"reports/{id}/intervention.json")
        if raw is None:
            raise ValueError(f"intervention {id!r}: its PR has no reports/{id}/intervention.json")
        return intervention_from_json(raw.decode())

    def report(self, id: str) -> str:
        """REPORT.md of the PR."""
        self.pr_state(id)
        return (self._read(self._tip(id), f"reports/{id}/REPORT.md") or b"").decode()

    def diff(self, id: str) -> str:
        """The PR's diff: branch against the main it forked from while open or closed; the merge
        against main before it once merged."""
        state = self.pr_state(id)
        if state in ("merged", "reverted"):
            merge = self._merge_commit(id)
            return self.repo.git.diff(merge.parents[0].hexsha, merge.hexsha)
        return self.repo.git.diff(f"{MAIN}...{self._tip(id).hexsha}")

    # ---- locking ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _git_lock(self, timeout_s: float = 60.0) -> Iterator[None]:
        fd = open_private_fd(self.swarm_dir / "git.lock", os.O_RDWR)   # 0600, never through a link
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"workspace {str(self.root)!r}: git lock busy for {timeout_s:.0f} s") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)   # closing the descriptor releases the flock

    # ---- building commits without a work tree -------------------------------------------------
    def _blob(self, data: bytes) -> str:
        hexsha = self.repo.odb.store(IStream(git.Blob.type, len(data), io.BytesIO(data))).hexsha
        return hexsha.decode() if isinstance(hexsha, bytes) else hexsha

    def _tree(self, base: git.Commit, files: dict[str, bytes], drop: str | None = None) -> str:
        """Tree sha of `base` with `files` (path → content) written, via a private index file;
        with `drop` (a folder path), what `base` has under it goes first."""
        fd, tmp = tempfile.mkstemp(prefix="swarm-index-", dir=self.swarm_dir)
        os.close(fd)
        os.unlink(tmp)   # read-tree wants to create it
        env = {"GIT_INDEX_FILE": tmp}
        try:
            self.repo.git.read_tree(base.hexsha, env=env)
            if drop:
                self.repo.git.rm("--cached", "-r", "-q", "--ignore-unmatch", "--", drop, env=env)
            args: list[str] = []
            for path, data in files.items():
                args += ["--cacheinfo", f"100644,{self._blob(data)},{path}"]
            if args:
                self.repo.git.update_index("--add", *args, env=env)
            return self.repo.git.write_tree(env=env)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _commit(self, tree: str, message: str, parents: list[git.Commit]) -> git.Commit:
        # messages quote model text (rationales, skill descriptions): no escapes reach `git log`
        return git.Commit.create_from_tree(self.repo, self.repo.tree(tree), clean_text(message), parent_commits=parents,
                                           head=False)

    def _set_ref(self, ref: str, new: git.Commit, old: git.Commit | None) -> None:
        # compare-and-swap: fails if another writer moved the ref meanwhile
        self.repo.git.update_ref(ref, new.hexsha, old.hexsha if old is not None else "0" * 40)

    def _pr_files(self, base: git.Commit, changes: dict[str, Any]) -> dict[str, bytes]:
        """recipe.yaml/harness.yaml of `base` with `changes` applied (only files that change)."""
        recipe, harness = self._yaml_at(base, FILES["recipe"]), self._yaml_at(base, FILES["harness"])
        new_recipe, new_harness = apply_changes(recipe, harness, changes)
        out = {}
        if new_recipe != recipe:
            out[FILES["recipe"]] = _dump_yaml(new_recipe).encode()
        if new_harness != harness:
            out[FILES["harness"]] = _dump_yaml(new_harness).encode()
        return out

    # ---- PR operations ------------------------------------------------------------------------
    def open_pr(self, iv: Intervention, report_md: str, attachments: dict[str, bytes] | None = None) -> str:
        """Open (or, while still open, update) the PR of `iv`; returns its branch name. The work
        tree and main are not touched."""
        _check_id(iv.id)
        attachments = dict(attachments or {})
        for name, data in attachments.items():
            if not _ATTACH_RE.match(name) or name in _RESERVED:
                raise ValueError(f"attachment name {name!r} is not allowed (a plain file name other than {sorted(_RESERVED)})")
            if not isinstance(data, (bytes, bytearray)):
                raise TypeError(f"attachment {name!r} must be bytes, got {type(data).__name__}")
        with self._git_lock():
            try:
                state = self.pr_state(iv.id)
            except ValueError:
                state = None
            if state not in (None, "open"):
                raise ValueError(f"intervention {iv.id}: its PR is already {state}; a new proposal needs a new id")
            main = self.main
            br = self._branch(iv.id)
            base = br.commit if br is not None else main
            name = br.name if br is not None else f"iv/{iv.id}-{iv.kind.value}"
            d = f"reports/{iv.id}"
            files = self._pr_files(base, iv.changes)
            files[f"{d}/REPORT.md"] = report_md.encode()
            files[f"{d}/intervention.json"] = (intervention_json(iv) + "\n").encode()
            files.update({f"{d}/{n}": bytes(b) for n, b in attachments.items()})
            tree = self._tree(base, files)
            if br is not None and tree == base.tree.hexsha:
                return name
            commit = self._commit(tree, _pr_message(iv, update=br is not None), [base])
            self._set_ref(f"refs/heads/{name}", commit, br.commit if br is not None else None)
        self._push(f"refs/heads/{name}")
        return name

    def update_report(self, iv: Intervention, report_md: str, attachments: dict[str, bytes] | None = None) -> str | None:
        """Rewrite the report files of `iv`'s PR (REPORT.md, intervention.json, attachments) in
        whatever state the PR is in, so the report follows the lifecycle: a commit on its branch
        while open, merged or reverted (main keeps the copy it merged: a rollback reverts exactly
        what was merged), on top of the closed tip once rejected (the `closed/<id>` tag moves and
        keeps its note). Returns the ref written, None when `iv` has no PR yet. Main, the work
        tree and `.git/index` are not touched."""
        _check_id(iv.id)
        attachments = dict(attachments or {})
        for name, data in attachments.items():
            if not _ATTACH_RE.match(name) or name in _RESERVED or not isinstance(data, (bytes, bytearray)):
                raise ValueError(f"attachment {name!r}: a plain file name other than {sorted(_RESERVED)}, with bytes")
        with self._git_lock():
            try:
                state = self.pr_state(iv.id)
            except ValueError:
                return None
            if state in ("merged", "reverted") and self._tag(f"merged/{iv.id}") is None:
                # tagging was interrupted: once the branch moves on, its tip is no longer what main merged
                self.repo.create_tag(f"merged/{iv.id}", ref=self._merge_commit(iv.id))
            br = self._branch(iv.id)
            if state != "closed" and br is None:
                return None
            tip = self._tip(iv.id)
            d = f"reports/{iv.id}"
            files = {f"{d}/REPORT.md": report_md.encode(), f"{d}/intervention.json": (intervention_json(iv) + "\n").encode(),
                     **{f"{d}/{n}": bytes(b) for n, b in attachments.items()}}
            tree = self._tree(tip, files)
            ref = f"refs/tags/closed/{iv.id}" if state == "closed" else br.path
            if tree == tip.tree.hexsha:
                return ref
            note = iv.history[-1].get("note", "") if iv.history else ""
            commit = self._commit(tree, f"Report of intervention {iv.id}: {iv.status.value}\n\n{note}".rstrip() + "\n", [tip])
            if state == "closed":
                tag = self._tag(f"closed/{iv.id}")
                message = tag.tag.message if tag.tag is not None else "rejected"
                self.repo.create_tag(f"closed/{iv.id}", ref=commit, message=clean_text(message), force=True)
            else:
                self._set_ref(br.path, commit, tip)
        self._push("+" + ref)   # a moved tag is not a fast-forward
        return ref

    def _require_clean_main(self) -> None:
        """approve/rollback write main's files in the work tree: it must be on main, with no
        uncommitted changes to tracked files (which a merge or revert could clobber)."""
        if self.repo.head.is_detached or self.repo.active_branch.name != MAIN:
            where = "a detached HEAD" if self.repo.head.is_detached else repr(self.repo.active_branch.name)
            raise ValueError(f"workspace {str(self.root)!r}: the work tree is on {where}; check out {MAIN} first")
        if self.repo.is_dirty(index=True, working_tree=True, untracked_files=False):
            dirty = sorted({d.a_path for d in self.repo.index.diff(None)} | {d.a_path for d in self.repo.index.diff("HEAD")})
            raise ValueError(f"workspace {str(self.root)!r} has uncommitted changes to {', '.join(dirty)}; "
                             f"commit or discard them first")

    def _conflicts(self, ours: git.Commit, theirs: git.Commit) -> bool:
        try:
            self.repo.git.merge_tree("--write-tree", "--no-messages", ours.hexsha, theirs.hexsha)
            return False
        except git.GitCommandError as e:
            if e.status == 1:
                return True
            raise

    def _update_branch(self, id: str, br: git.Head) -> None:
        """Re-apply the PR's changes onto the current main: a commit with parents [tip, main]."""
        tip, main = br.commit, self.main
        iv = self.intervention(id)
        files = self._pr_files(main, iv.changes)
        for b in (tip.tree / f"reports/{id}").traverse():
            if b.type == "blob":
                files[b.path] = b.data_stream.read()
        commit = self._commit(self._tree(main, files),
                              f"Update intervention {id} onto {MAIN}\n\nIts changes re-applied to the current "
                              f"{MAIN} (a textual merge conflicted): {_changes_line(iv.changes)}", [tip, main])
        self._set_ref(br.path, commit, tip)

    def approve(self, id: str) -> str:
        """Merge the PR into main (`--no-ff`); returns the merge commit's sha."""
        with self._git_lock():
            state = self.pr_state(id)
            if state == "merged":
                raise ValueError(f"intervention {id} is already approved (merged as {self._merge_commit(id).hexsha[:10]})")
            if state == "reverted":
                raise ValueError(f"intervention {id} was approved and then rolled back; propose it again under a new id")
            if state == "closed":
                raise ValueError(f"intervention {id} was rejected; its PR is closed")
            self._require_clean_main()
            br = self._branch(id)
            if self._conflicts(self.main, br.commit):
                self._update_branch(id, br)
            iv = self.intervention(id)
            msg = (f"Merge intervention {id} ({iv.kind.value}): {iv.diagnosis.name}\n\n"
                   f"{_changes_line(iv.changes)}\nrisk: {iv.risk.value}; proposed by {iv.operator} ({iv.policy})")
            try:
                self.repo.git.merge("--no-ff", "--no-edit", "-m", clean_text(msg), br.name)
            except git.GitCommandError as e:
                if (pathlib.Path(self.repo.git_dir) / "MERGE_HEAD").exists():
                    self.repo.git.merge("--abort")
                raise ValueError(f"intervention {id}: merge into {MAIN} failed, nothing changed: "
                                 f"{_git_error(e)}") from None
            merge = self.repo.head.commit
            self.repo.create_tag(f"merged/{id}", ref=merge)
        self._push(f"refs/heads/{MAIN}", f"refs/heads/{br.name}", f"refs/tags/merged/{id}")
        return merge.hexsha

    def write_final_report(self, report_md: str, attachments: dict[str, bytes] | None = None) -> pathlib.Path:
        """Commit `reports/final/REPORT.md` (+ attachments) on main; returns the report's path."""
        self.commit_files({"reports/final/REPORT.md": report_md.encode(),
                           **{f"reports/final/{k}": v for k, v in (attachments or {}).items()}}, "Final report")
        return self.root / "reports" / "final" / "REPORT.md"

    def skill_pr(self, name: str, version: int, files: dict[str, bytes], message: str, merge: bool = True,
                 replace: bool = False) -> str:
        """A new or changed skill as a PR: branch `skill/<name>-v<version>` with one commit on top of
        main writing `files` (paths under skills/<name>/), merged `--no-ff` into main when `merge`
        (tag `merged/skill-<name>-v<version>`). With `replace`, `files` is the whole folder: files
        main has under skills/<name>/ that it does not list are removed. Returns the branch name.
        Idempotent: a branch that already exists (a crash after opening it) is merged, not opened again."""
        if not re.match(r"^[a-z0-9][a-z0-9-]{0,63}$", name) or not isinstance(version, int) or version < 1:
            raise ValueError(f"skill PR: name {name!r} / version {version!r} not usable in a branch name")
        for rel in files:
            if not rel.startswith(f"skills/{name}/") or ".." in rel.split("/"):
                raise ValueError(f"skill PR {name}: file {rel!r} is not under skills/{name}/")
        branch = f"skill/{name}-v{version}"
        tag = f"merged/skill-{name}-v{version}"
        with self._git_lock():
            if self._tag(tag) is not None:
                return branch
            head = self.repo.heads[branch] if branch in self.repo.heads else None
            if head is None:
                main = self.main
                tree = self._tree(main, files, drop=f"skills/{name}" if replace else None)
                if tree == main.tree.hexsha:
                    return branch      # nothing changes
                commit = self._commit(tree, message, [main])
                self._set_ref(f"refs/heads/{branch}", commit, None)
            if merge:
                self._require_clean_main()
                self.repo.git.merge("--no-ff", "--no-edit", "-m", f"Merge skill {name} v{version}", branch)
                self.repo.create_tag(tag, ref=self.repo.head.commit)
        self._push(f"refs/heads/{branch}", *((f"refs/heads/{MAIN}", f"refs/tags/{tag}") if merge else ()))
        return branch

    def commit_files(self, files: dict[str, bytes], message: str) -> str | None:
        """Write and commit `files` on main directly (workspace set-up, e.g. the seed skills);
        returns the commit sha, None when nothing changed."""
        with self._git_lock():
            self._require_clean_main()
            for rel, data in files.items():
                _write_tree_file(self.root, rel, data)
            # git itself (not gitpython's index writer), so the index, objects and refs it writes
            # are made under GIT_UMASK; no hooks and the message verbatim, as the index API did
            self.repo.git.add("--", *files)
            if not self.repo.git.diff("--cached", "--name-only", "HEAD"):
                return None
            self.repo.git.commit("--no-verify", "--cleanup=verbatim", "--allow-empty-message", "-m", clean_text(message))
            sha = self.repo.head.commit.hexsha
        self._push(f"refs/heads/{MAIN}")
        return sha

    def reject(self, id: str, note: str = "") -> str:
        """Close the PR: tag its tip `closed/<id>` (annotated with `note`) and delete the branch.
        Returns the tag name. Main is not touched."""
        with self._git_lock():
            state = self.pr_state(id)
            if state == "closed":
                raise ValueError(f"intervention {id} is already rejected")
            if state in ("merged", "reverted"):
                raise ValueError(f"intervention {id} is already {'merged' if state == 'merged' else 'merged and rolled back'}; "
                                 f"use rollback to undo a merged intervention")
            br = self._branch(id)
            tag = f"closed/{id}"
            self.repo.create_tag(tag, ref=br.commit, message=clean_text(f"rejected: {note}" if note else "rejected"))
            name = br.name
            self.repo.delete_head(br, force=True)
        self._push(f"refs/tags/{tag}", f":refs/heads/{name}")
        return tag

    def rollback(self, id: str) -> str:
        """Revert the PR's merge on main (`git revert -m 1`, keeping reports/<id>/); returns the
        revert commit's sha."""
        with self._git_lock():
            state = self.pr_state(id)
            if state == "open":
                raise ValueError(f"intervention {id} is not merged; nothing to roll back (reject it instead)")
            if state == "closed":
                raise ValueError(f"intervention {id} was rejected and never merged; nothing to roll back")
            if state == "reverted":
                raise ValueError(f"intervention {id} is already rolled back")
            self._require_clean_main()
            merge = self._merge_commit(id)
            msg = (f"Roll back intervention {id}\n\nThis reverts commit {merge.hexsha}, reversing\n"
                   f"changes made to {merge.parents[0].hexsha}.\nReports under reports/{id}/ are kept.")
            try:
                self.repo.git.revert("-m", "1", "--no-commit", merge.hexsha)
                reverted = True
            except git.GitCommandError:
                self.repo.git.reset("--merge")   # back to HEAD, leaving unrelated local changes
                reverted = False
            try:
                if reverted:
                    if self._read(self.repo.head.commit, f"reports/{id}/REPORT.md") is not None:
                        self.repo.git.restore("--source=HEAD", "--staged", "--worktree", "--", f"reports/{id}")
                else:
                    msg += "\nDone key by key: a textual revert conflicted with later changes, which stand."
                    self._semantic_revert(id, merge)
                self.repo.git.commit("--allow-empty", "-m", clean_text(msg))
            except git.GitCommandError as e:
                self.repo.git.reset("--merge")
                raise ValueError(f"intervention {id}: rollback failed, nothing changed: {_git_error(e)}") from None
            commit = self.repo.head.commit
            self.repo.create_tag(f"reverted/{id}", ref=commit)
        self._push(f"refs/heads/{MAIN}", f"refs/tags/reverted/{id}")
        return commit.hexsha

    def _semantic_revert(self, id: str, merge: git.Commit) -> None:
        """Put back, in the work tree and index, the pre-merge value of every key the merge set
        that still has the value the merge gave it."""
        before, after, head = merge.parents[0], merge, self.repo.head.commit
        for section in ("recipe", "harness"):
            path = FILES[section]
            b, a, cur = self._yaml_at(before, path), self._yaml_at(after, path), self._yaml_at(head, path)
            new = copy.deepcopy(cur)
            for key in self.intervention(id).changes:
                sec, _, rest = key.partition(".")
                if sec != section:
                    continue
                if get_dotted(cur, rest) != get_dotted(a, rest):
                    continue   # changed again since: the later change stands
                had, old = get_dotted(b, rest)
                if had:
                    put_dotted(new, rest, old, name=key)
                else:
                    del_dotted(new, rest)
            if new != cur:
                write_private(self.root / path, _dump_yaml(new))
                self.repo.git.add("--", path)

    # ---- remote -------------------------------------------------------------------------------
    def _push(self, *refspecs: str) -> None:
        if not self.push or "origin" not in [r.name for r in self.repo.remotes]:
            return
        try:
            self.repo.git.push("origin", *refspecs)
        except git.GitCommandError as e:
            msg = f"push of {', '.join(refspecs)} to origin failed: {_git_error(e)}"
            log.warning(msg)
            self.push_errors.append(msg)


def _git_error(e: git.GitCommandError) -> str:
    text = (e.stderr or e.stdout or str(e)).strip().replace("stderr: ", "").strip("' \n")
    return " ".join(text.split())[:400]


def _changes_line(changes: dict[str, Any]) -> str:
    if not changes:
        return "changes: none (report only)"
    return "changes: " + ", ".join(f"{k}={v!r}" for k, v in changes.items())


def _pr_message(iv: Intervention, update: bool = False) -> str:
    head = "Update" if update else "Intervention"
    return (f"{head} {iv.id} ({iv.kind.value}): {iv.diagnosis.name}\n\n"
            f"{iv.rationale.strip()}\n\n{_changes_line(iv.changes)}\n"
            f"risk: {iv.risk.value}; proposed by {iv.operator} ({iv.policy})\n")


def _ensure_identity(repo: git.Repo) -> None:
    """Commits need an author; a machine without a git identity gets a local one. Asked through
    `git config` itself, so every source git reads counts (system, $GIT_CONFIG_GLOBAL or
    ~/.gitconfig, XDG, the repository, $GIT_CONFIG_* overrides) — gitpython's own reader
    misses some of them."""
    for key, value in zip(("user.name", "user.email"), _IDENTITY):
        try:
            repo.git.config("--get", key)
        except git.GitCommandError:      # exit 1: not set anywhere git looks
            repo.git.config("--local", key, value)
