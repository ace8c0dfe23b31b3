"""The GPU hosts over SSH, and SGLang on them."""

import warnings

# asyncssh (2.24) names DSA key types at import, and cryptography 51 warns about DSA there: a screen
# of warnings on every command that reaches a host, about a key type regen never offers or accepts.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh\.")
