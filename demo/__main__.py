"""``python -m demo``: the click-count streaming demo."""

from demo.clicks import main

main()
