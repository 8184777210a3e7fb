def main():
    raise KeyError("deliberate failure in a module")


main()
