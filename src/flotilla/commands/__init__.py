"""flotilla.commands"""
