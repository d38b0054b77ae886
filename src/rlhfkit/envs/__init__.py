"""Multi-turn environments and tools (docs/environments.md)."""

from rlhfkit.envs.base import Environment, Message, Step, as_step, check_messages
from rlhfkit.envs.builtin import ArithmeticToolEnv, SelfCorrectEnv
from rlhfkit.envs.calculator import CALCULATOR, make_lookup_tool
from rlhfkit.envs.registry import make_env_factory
from rlhfkit.envs.tools import (
    Tool,
    ToolCall,
    ToolError,
    ToolResult,
    call_tool,
    describe_tools,
    format_call,
    observation_message,
    observation_role,
    parse_tool_call,
    run_tool_call,
    tool_format,
)

__all__ = [
    "CALCULATOR",
    "ArithmeticToolEnv",
    "Environment",
    "Message",
    "SelfCorrectEnv",
    "Step",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "as_step",
    "call_tool",
    "check_messages",
    "describe_tools",
    "format_call",
    "make_env_factory",
    "make_lookup_tool",
    "observation_message",
    "observation_role",
    "parse_tool_call",
    "run_tool_call",
    "tool_format",
]
