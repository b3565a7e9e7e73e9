"""The ground floor's basics: one module per shared concern, importing nothing else of the library.

Errors, domains, graph walks, file I/O, dtypes, progress lines, an op's names across tiers, private
torch calls, the cache root and how opbridge was installed. Everything above (the check vocabulary,
specs, the registry, the op object) builds on these; none of them imports upward.
"""
