"""flotilla.controller"""
