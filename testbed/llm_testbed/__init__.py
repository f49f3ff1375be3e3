"""The local test bed: a control plane of real upstream binaries, fake nodes, chaos, and the demo.

Not part of the operator's runtime (the operator image does not install it). See docs/development.md.
"""
