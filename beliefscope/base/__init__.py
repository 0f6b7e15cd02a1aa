"""The bottom of the package: helpers every layer may use, which import no other part of beliefscope.

- ``files``: atomic writes (a temporary file, then a rename) and JSON/text readers;
- ``progress``: the one progress bar of the command line and the long jobs;
- ``config_flags``: command-line flags built from a config dataclass and its field comments.
"""
