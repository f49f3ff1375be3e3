"""The two images (``images/operator``, ``images/trainer``) built for real where Docker is not: podman + runc.

``make images`` (``python -m llm_testbed.images build``) builds both from the same Dockerfiles users build
with Docker, on a local Debian base (mmdebstrap) and a wheelhouse made on the host, with nothing
downloaded inside the build; images are cached per machine by content, like the Go tools. Standard
library only, so CI can start the build before the virtualenv exists. See docs/development.md, "Images".
"""
