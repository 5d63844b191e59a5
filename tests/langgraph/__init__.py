"""Tests of the LangGraph adapter (remit_langgraph)."""
