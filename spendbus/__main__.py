from spendbus.cli import main

main()
