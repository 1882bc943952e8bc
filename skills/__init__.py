"""The skill library: operator know-how the swarm learns and reuses, in Agent Skills format.

What: a skill says "when diagnosis X shows in the run's evidence, do intervention Y". Each is a
folder with a SKILL.md (YAML front matter + markdown: when it applies, what to do, evidence with
links to the episodes it came from) and optionally a program `skill.py` (trigger/propose).

Why: fixes that worked (and the ones that did not) should outlive the run that found them. The
controller retrieves skills by similarity to what is wrong, weights them by how they did in
past episodes, and operators propose a firing skill's fix; the format is the open Agent Skills
one, so skills written by other tools load too (as retrievable text, without a trigger).

How:
    from skills import SkillLibrary, parse_skill, seed_dir, verify, fires
    lib = SkillLibrary(workspace / "skills")
    skills, errors = lib.load()
    fires(skill.swarmlab.trigger, view)                  # declarative trigger, in-process
    verify(skill, covered=[view], unrelated=[other])     # programs run only in the sandbox
    lib.rank(hits, utility_from_episodes(episodes, retrievals))

Modules: `skill.py` (format, parsing, SkillError), `trigger.py` (declarative triggers),
`verify.py` (sandboxed programs, verification), `library.py` (folder, ranking, packs),
`seed/` (hand-written skills for the common pathologies). Tests: tests/test_skills.py.
"""
from skills.library import SkillLibrary, SkillPackError, Utility, seed_dir, utility_from_episodes
from skills.skill import InterventionSpec, Skill, SkillError, SwarmlabBlock, parse_skill, parse_skill_text
from skills.trigger import Condition, TriggerSpec, fires
from skills.verify import ProgramResult, SkillProgramError, Verdict, run_program, verify

__all__ = [
    "Condition",
    "InterventionSpec",
    "ProgramResult",
    "Skill",
    "SkillError",
    "SkillLibrary",
    "SkillPackError",
    "SkillProgramError",
    "SwarmlabBlock",
    "TriggerSpec",
    "Utility",
    "Verdict",
    "fires",
    "parse_skill",
    "parse_skill_text",
    "run_program",
    "seed_dir",
    "utility_from_episodes",
    "verify",
]
