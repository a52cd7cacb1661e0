"""The engine under every hand-written collective: deadlines, calls and their tags, scratch buffers, work handles, costs."""
