"""flotilla.operator"""
