"""The compiler: tracer, IR, passes, memory planner, policy and code generation.

Not built yet: this package is reserved for the compiler issue.
"""
