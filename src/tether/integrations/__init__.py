"""Bridges between Tether and other agent frameworks, one subpackage each.

Nothing here is imported by `import tether`: a bridge imports its framework, so it is loaded only
when asked for (`from tether.integrations.langgraph import TetherSaver`).
"""
