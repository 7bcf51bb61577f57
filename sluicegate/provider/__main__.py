"""`python -m sluicegate.provider --port 18081 --name alpha ...`"""

from sluicegate.provider.cli import main

main()
