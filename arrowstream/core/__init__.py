"""The stage protocol and the execution of stages over chunks."""
