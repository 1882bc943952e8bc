"""Skill library in Agent Skills format (SKILL.md), mined and verified; arrives with the skills issue."""
