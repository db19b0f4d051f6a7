"""Tool-call formats: one interface (`base.ToolParser`), its implementations, their registry.

`base` holds the interface and `register_tool_parser`; `registry` finds every format module
in this package and looks names up (router setting `tool_call_parser`); `hermes` is the
format of the shipped tool template; `forced` reads the JSON of forced calls (`tool_choice`
"required" or a named function). Nothing here imports the router's routes or state.
"""
